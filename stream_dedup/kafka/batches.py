"""A lenient reader of Kafka record batches (message format v2): bytes -> records (pure).

Kafka's protocol says a header key is a UTF-8 string, but brokers store whatever a producer
sent (`kcat -H $'\\xff\\xfekey=v'` is enough). aiokafka's reader decodes every key strictly,
so one such record raises UnicodeDecodeError from inside `getmany`, for every later fetch
of that partition: the stream stops for good. The consumer adapter (`kafka/client.py`) reads
batches with aiokafka's fast reader and falls back to this one for a batch the fast reader
refuses; here a header key is decoded with `surrogateescape`, so the record arrives, its
original bytes can be recovered (`raw_header_key`), and `kafka/messages.py` makes it a
`bad-header` reject with the record's bytes on the dead-letter topic.

Layout (Kafka's DefaultRecordBatch; all integers big-endian, varints zigzag-encoded):

    batch  = base_offset:i64 length:i32 leader_epoch:i32 magic:i8 crc:u32 attributes:i16
             last_offset_delta:i32 first_ts:i64 max_ts:i64 producer_id:i64
             producer_epoch:i16 base_sequence:i32 count:i32 records (compressed as a whole
             when attributes & 7 != 0)
    record = length:varint attributes:i8 ts_delta:varlong offset_delta:varint
             key_len:varint key value_len:varint value header_count:varint
             (key_len:varint key value_len:varint value) * header_count
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

BATCH_HEADER = 61  # bytes before the first record
_HEADER = struct.Struct(">qiibIhiqqqhii")
_LOG_APPEND_TIME = 0x08


class BatchFormatError(ValueError):
    """The bytes are not a well-formed v2 record batch."""


@dataclass(frozen=True, slots=True)
class LenientRecord:
    """The fields aiokafka's fetcher reads of a record (its DefaultRecord's shape)."""

    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    checksum: None = None


def raw_header_key(key: str) -> bytes:
    """The bytes a header key arrived as (inverse of the lenient decoding)."""
    return key.encode("utf-8", "surrogateescape")


def read_batch(
    data: bytes | memoryview, decompress: Callable[[int, bytes], bytes] | None = None
) -> Iterator[LenientRecord]:
    """Every record of one v2 batch. `decompress(codec, payload)` undoes attributes & 7."""
    if len(data) < BATCH_HEADER:
        raise BatchFormatError(f"a record batch needs {BATCH_HEADER} bytes, got {len(data)}")
    (base_offset, _length, _epoch, magic, _crc, attributes, _last, first_ts, max_ts,
     _pid, _pepoch, _seq, count) = _HEADER.unpack_from(data, 0)
    if magic != 2:
        raise BatchFormatError(f"magic {magic}: only v2 batches carry headers")
    body = bytes(data[BATCH_HEADER:])
    codec = attributes & 0x07
    if codec:
        if decompress is None:
            raise BatchFormatError(f"compressed batch (codec {codec}) and no decompressor")
        body = decompress(codec, body)
    ts_type = 1 if attributes & _LOG_APPEND_TIME else 0
    pos = 0
    for _ in range(count):
        length, pos = _varint(body, pos)
        end = pos + length
        if length < 0 or end > len(body):
            raise BatchFormatError(f"record length {length} runs past the batch")
        pos += 1  # record attributes (unused)
        ts_delta, pos = _varint(body, pos)
        offset_delta, pos = _varint(body, pos)
        key, pos = _bytes(body, pos, end)
        value, pos = _bytes(body, pos, end)
        n_headers, pos = _varint(body, pos)
        if n_headers < 0:
            raise BatchFormatError(f"negative header count {n_headers}")
        headers: list[tuple[str, bytes | None]] = []
        for _ in range(n_headers):
            name, pos = _bytes(body, pos, end)
            if name is None:
                raise BatchFormatError("a header without a key")
            hvalue, pos = _bytes(body, pos, end)
            headers.append((name.decode("utf-8", "surrogateescape"), hvalue))
        pos = end
        yield LenientRecord(
            offset=base_offset + offset_delta,
            timestamp=max_ts if ts_type else first_ts + ts_delta,
            timestamp_type=ts_type, key=key, value=value, headers=headers,
        )


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise BatchFormatError("a varint runs past the batch")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _bytes(buf: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    n, pos = _varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > end:
        raise BatchFormatError(f"a field of {n} bytes runs past its record")
    return buf[pos:pos + n], pos + n


KafkaHeaders = Sequence[tuple[str, bytes]]  # a record's headers, as aiokafka gives them


def source_of(topic: str, partition: int, offset: int) -> str:
    return f"{topic}/{partition}/{offset}"


def is_utf8(name: str) -> bool:
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # surrogate-escaped bytes of a key that was not UTF-8
        return False
    return True
