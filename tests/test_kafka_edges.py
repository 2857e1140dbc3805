"""The Kafka edge without a broker: the lenient record reader, the log rate limit, and the
messages built for a decision (reduced to fit their topic)."""

from __future__ import annotations

import asyncio
import json
import logging
import struct

import pytest
from aiokafka.errors import KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c
from hypothesis import given
from hypothesis import strategies as st

from stream_dedup import Settings
from stream_dedup.kafka.batches import BatchFormatError, raw_header_key, read_batch
from stream_dedup.kafka.client import (
    RateLimitedLog,
    partition_of,
    producer_kwargs,
    send_batched,
)
from stream_dedup.kafka.decisions import Record, Topics, messages_for
from stream_dedup.kafka.messages import page_from_message
from stream_dedup.kafka.tolerating import ToleratingRecords
from stream_dedup.models import Decision, Page, Rejected


def batch(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]],
          base_offset: int = 100, compression: int = 0,
          patch: tuple[bytes, bytes] | None = None) -> bytes:
    """A v2 batch built by aiokafka; `patch` swaps bytes afterwards (a header key aiokafka
    would refuse to encode) and the CRC is recomputed so aiokafka's reader accepts it."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=compression, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=10_000_000)
    for i, (key, value, headers) in enumerate(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=headers)
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    if patch is not None:
        old, new = patch
        assert len(old) == len(new) and data.count(old) == 1
        data = bytearray(bytes(data).replace(old, new))
        struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


def test_lenient_reader_matches_aiokafka_on_well_formed_batches() -> None:
    recs = [(b"k1", b"v1", [("a", b"1")]), (None, b"v2", []), (b"k3", None, [("b", b""),
                                                                             ("c", b"x")])]
    data = batch(recs)
    fast = ToleratingRecords(data).next_batch()
    want = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in fast]
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in read_batch(data)]
    assert got == want
    assert [o for o, *_ in got] == [100, 101, 102]


def test_a_header_key_that_is_not_utf8_is_read_not_raised() -> None:
    recs = [(b"k0", b"good", [("x", b"1")]), (b"k1", b"poison", [("QQkey", b"v")]),
            (b"k2", b"after", [])]
    data = batch(recs, patch=(b"QQkey", b"\xff\xfekey"))
    records = ToleratingRecords(data)
    got = list(records.next_batch())
    assert [r.value for r in got] == [b"good", b"poison", b"after"]
    assert [r.offset for r in got] == [100, 101, 102]
    (name, value), = got[1].headers
    assert raw_header_key(name) == b"\xff\xfekey" and value == b"v"
    assert not records.has_next()


def test_compressed_batch_read_leniently() -> None:
    recs = [(b"k", b"v" * 100, [("QQ", b"1")]), (b"k2", b"w" * 100, [])]
    plain = batch(recs)
    gz = batch(recs, compression=1)
    assert [r.value for r in read_batch(gz, _gunzip)] == [r.value for r in read_batch(plain)]


@pytest.mark.parametrize("codec", [1, 2, 3, 4])  # gzip, snappy, lz4, zstd
def test_compressed_batches_through_the_fetch_path(codec: int) -> None:
    """The fetcher's way: iter() on the batch (aiokafka decompresses there), then next()."""
    recs = [(b"k", b"v" * 100, [("a", b"1")]), (b"k2", b"w" * 100, [])]
    got = [r.value for r in ToleratingRecords(batch(recs, compression=codec)).next_batch()]
    assert got == [b"v" * 100, b"w" * 100]


def _gunzip(codec: int, payload: bytes) -> bytes:
    import gzip
    assert codec == 1
    return gzip.decompress(payload)


@given(st.binary(max_size=300))
def test_lenient_reader_refuses_garbage_cleanly(data: bytes) -> None:
    try:
        list(read_batch(data))
    except BatchFormatError:
        pass


def test_bad_header_key_becomes_a_reject_with_the_value() -> None:
    name = b"\xff\xfekey".decode("utf-8", "surrogateescape")
    item = page_from_message(b'{"url": "u", "html": "x"}', b"k", [(name, b"v")], "t/0/1",
                             input_format="json", max_bytes=1000)
    assert isinstance(item, Rejected) and item.kind == "bad-header"
    assert item.raw == b'{"url": "u", "html": "x"}' and "xff" in item.message


@pytest.mark.parametrize(("status", "expected"), [
    (b"200", 200), (b" 404 ", 404), ("²".encode(), "bad-field"), (b"2000", "bad-field"),
    (b"ok", "bad-field")])
def test_html_status_header(status: bytes, expected: object) -> None:
    item = page_from_message(b"<p>x</p>", b"https://a/", [("status", status)], "t/0/1",
                             input_format="html", max_bytes=1000)
    got = item.kind if isinstance(item, Rejected) else item.status
    assert got == expected


def test_surrogate_url_is_a_reject_and_every_decision_encodes() -> None:
    item = page_from_message(b'{"url":"https://x/\\ud800","html":"<p>hi</p>"}', None, [],
                             "t/0/1", input_format="json", max_bytes=1000)
    assert isinstance(item, Rejected) and item.kind == "bad-url"
    d = Decision("https://x/\ud800", "reject", "bad-field", error="got '\udcff'")
    assert json.loads(d.to_json().encode("utf-8"))["url"] == "https://x/?"


# --- messages for a decision --------------------------------------------------------------
TOPICS = Topics("dec", "kept", "dead")


def _rec(value: bytes, key: bytes = b"k") -> Record:
    return Record("in", 0, 7, key, value, (("h", b"1"),))


def test_messages_fit_as_they_are() -> None:
    d = Decision("https://a/", "keep", "unique", page_id=3, source="in/0/7")
    msgs, reduced = messages_for(_rec(b"page"), None, d, TOPICS, lambda t: 1_000_000)
    assert reduced == [] and [(m.topic, m.value) for m in msgs] == [
        ("dec", d.to_json().encode()), ("kept", b"page")]
    assert msgs[1].headers == (("h", b"1"),)


def test_oversize_outputs_are_reduced_to_fit() -> None:
    limit = 20_000
    url = "https://a/" + "x" * 30_000
    keep = Decision(url, "keep", "unique", page_id=1, source="in/0/7")
    msgs, reduced = messages_for(_rec(b"p" * 50_000, url.encode()), None, keep, TOPICS,
                                 lambda t: limit)
    assert reduced == ["decision", "kept"]
    assert all(m.size() <= limit for m in msgs)
    decision, ref = msgs
    assert json.loads(decision.value)["page_id"] == "1"
    assert dict(ref.headers)["stream-dedup-ref"] == b"in/0/7" and ref.value == b""
    item = Rejected(url, "bad-json", "nope", "in/0/7", b"z" * 50_000)
    reject = Decision(url, "reject", "bad-json", error="nope", source="in/0/7")
    msgs, reduced = messages_for(_rec(b"z" * 50_000), item, reject, TOPICS, lambda t: limit)
    dead = msgs[1]
    assert reduced == ["decision", "dead-letter"] and dead.size() <= limit
    assert dead.value == b"z" * len(dead.value) and len(dead.value) > limit - 2000
    assert dict(dead.headers)["stream-dedup-truncated"] == b"50000"


def test_a_page_the_engine_rejects_is_a_dead_letter_saying_why() -> None:
    """A revisit record with no version to refer to is a Page rejected by the engine, not
    by a reader: its dead letter carries the record and the decision's kind and message."""
    page = Page("https://a/", b"", source="in/0/7")
    d = Decision("https://a/", "reject", "revisit-unknown", error="no version",
                 source="in/0/7")
    msgs, _ = messages_for(_rec(b"WARC/1.1 ..."), page, d, TOPICS, lambda t: 1_000_000)
    dead = msgs[1]
    assert (dead.topic, dead.value) == ("dead", b"WARC/1.1 ...")
    assert dict(dead.headers)["stream-dedup-error"] == b"revisit-unknown"
    assert dict(dead.headers)["stream-dedup-message"] == b"no version"


# --- log rate limit -----------------------------------------------------------------------
def test_rate_limited_log_keeps_a_few_lines_per_interval_and_counts_the_rest() -> None:
    now = [0.0]
    dropped: list[int] = []
    limiter = RateLimitedLog(interval=10, burst=3, clock=lambda: now[0],
                             on_drop=lambda: dropped.append(1))

    def rec(msg: str) -> logging.LogRecord:
        return logging.LogRecord("aiokafka", logging.ERROR, __file__, 1, msg, None, None)

    passed = [limiter.filter(rec("Unable connect to node")) for _ in range(1000)]
    assert sum(passed) == 3 and len(dropped) == 997
    assert limiter.filter(rec("another message"))  # its own budget
    now[0] = 11
    first = rec("Unable connect to node")
    assert limiter.filter(first) and "997 similar lines dropped" in first.getMessage()


def test_the_producer_partitions_by_key_as_aiokafka_does_but_one_partition_unhashed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """partition_of: murmur2 of the key modulo the partitions, as aiokafka's default; with
    one partition, that partition without hashing the key."""
    keys = [f"https://a.example/{i}".encode() for i in range(200)] + [b""]
    for n in (2, 3, 12):
        parts = list(range(n))
        assert [partition_of(k, parts, parts) for k in keys] == [
            DefaultPartitioner()(k, parts, parts) for k in keys]
    hashed: list[bytes] = []
    monkeypatch.setattr("aiokafka.partitioner.murmur2", lambda k: hashed.append(k) or 0)
    assert partition_of(b"https://a.example/", [7], [7]) == 7 and partition_of(None, [7], []) == 7
    assert hashed == []
    assert producer_kwargs(Settings())["partitioner"] is partition_of


def test_send_batched_queues_nothing_when_the_metadata_is_unreachable() -> None:
    """The first topic whose partitions cannot be learnt fails every send of the call: the
    metadata wait (request_timeout_ms) is not repeated for every topic, and nothing half of
    the batch is queued."""
    asked: list[str] = []

    class NoMetadata:
        def create_batch(self) -> None:
            raise AssertionError("nothing may be queued")

        async def partitions_for(self, topic: str) -> set[int]:
            asked.append(topic)
            raise KafkaTimeoutError()

    sends = [("decisions", b"k", b"v", []), ("kept", b"k", b"page", [])]
    got = asyncio.run(send_batched(NoMetadata(), sends))  # type: ignore[arg-type]
    assert [type(e) for e in got] == [KafkaTimeoutError, KafkaTimeoutError]
    assert asked == ["decisions"]
