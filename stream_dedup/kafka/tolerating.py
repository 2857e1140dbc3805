"""A record aiokafka cannot read, read all the same: a header key that is not UTF-8 makes
aiokafka's record reader raise inside `getmany`, for that record on every fetch, and the
stream stops for good. `ToleratingRecords` reads a fetched partition's batches with
aiokafka's fast reader and, for a batch it refuses, goes on with `sources.records.read_batch`
(header keys decoded with `surrogateescape`), so the record arrives and `sources.kafka` turns
it into a `bad-header` dead letter. `kafka_client.make_consumer` installs it.
"""

from __future__ import annotations

import logging
from typing import Any

import aiokafka.codec as codec
import aiokafka.consumer.fetcher as fetcher_module

from stream_dedup.kafka.batches import BatchFormatError, read_batch

log = logging.getLogger("stream_dedup.kafka")


class _ToleratingBatch:
    """One v2 batch: aiokafka's fast reader until it refuses a record, then the lenient one
    for the rest of the batch (records already given are skipped by offset)."""

    def __init__(self, fast: Any, data: bytes) -> None:
        self._fast = fast
        self._records: Any = fast  # the fast reader's iterator once iter() made it
        self._data = data
        self._rest: Any = None
        self._last = -1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fast, name)

    def __iter__(self) -> _ToleratingBatch:
        self._records = iter(self._fast)  # aiokafka decompresses the batch here
        return self

    def __next__(self) -> Any:
        if self._rest is None:
            try:
                record = next(self._records)
            except UnicodeDecodeError as exc:
                log.warning("a record with a header key that is not UTF-8 (%s) after offset %d;"
                            " reading the rest of its batch leniently", exc.reason, self._last)
                last = self._last
                self._rest = (r for r in read_batch(self._data, _decompress) if r.offset > last)
            else:
                self._last = record.offset
                return record
        return next(self._rest)


class ToleratingRecords:
    """aiokafka's MemoryRecords (a fetched partition's batches), whose v2 batches fall back
    to the lenient reader; the fetcher builds one per fetched partition."""

    def __init__(self, data: bytes) -> None:
        self._fast = _FAST_RECORDS(data)
        self._data = data
        self._pos = 0

    def size_in_bytes(self) -> int:
        return int(self._fast.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._fast.has_next())

    def next_batch(self) -> Any:
        batch = self._fast.next_batch()
        if batch is None:
            return None
        start = self._pos
        self._pos = start + 12 + int.from_bytes(self._data[start + 8:start + 12], "big")
        if batch.magic < 2:  # v0/v1 messages have no headers
            return batch
        return _ToleratingBatch(batch, self._data[start:self._pos])


_FAST_RECORDS = fetcher_module.MemoryRecords


def install_tolerating_reader() -> None:
    """Make aiokafka's fetcher read batches through ToleratingRecords (idempotent)."""
    if fetcher_module.MemoryRecords is not ToleratingRecords:
        fetcher_module.MemoryRecords = ToleratingRecords


def _decompress(kind: int, payload: bytes) -> bytes:
    decoders = {1: codec.gzip_decode, 2: codec.snappy_decode, 3: codec.lz4_decode,
                4: codec.zstd_decode}
    if kind not in decoders:
        raise BatchFormatError(f"unknown compression codec {kind}")
    return bytes(decoders[kind](payload))
