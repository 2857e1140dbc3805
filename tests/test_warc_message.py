"""One WARC record a Kafka message (`serve --input-format warc`): the pure record -> page path
(kafka/warc_message.py), against what replay makes of the same record in a file, and the
runner's handling of the records that are not pages (Skipped: no decision, committed).

Records are written here (warcgen); the corpus test reads ../shared/corpora/warc in place.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from test_runner import FakeConsumer, FakeProducer, record
from warcgen import (
    Resp,
    http_block,
    metadata,
    request,
    response,
    revisit,
    warc_record,
    warcinfo,
    write_warc,
)

from stream_dedup import Deduplicator, Settings
from stream_dedup.kafka.edges import KafkaSink, KafkaSource
from stream_dedup.kafka.messages import page_from_message
from stream_dedup.kafka.warc_message import page_from_warc
from stream_dedup.metrics import Metrics
from stream_dedup.models import Page, Rejected, Skipped
from stream_dedup.runner.loop import Runner
from stream_dedup.sources.fastwarc_reader import record_bytes
from stream_dedup.sources.warc import iter_archive

CORPUS = Path(__file__).parents[2] / "shared" / "corpora" / "warc"
HTML = b"<!DOCTYPE html><html><head><title>t</title></head><body>" + b"word " * 300 + b"</body>"
LIMIT = 8 << 20


def one(value: bytes, position: int | None = None) -> Page | Rejected | Skipped:
    return page_from_warc(value, "t/0/7", max_bytes=LIMIT, position=position)


def as_file(tmp_path: Path, rec: bytes) -> list[Page | Rejected]:
    """What replay makes of the record, alone in a file."""
    return list(iter_archive(write_warc(tmp_path / "one.warc.gz", [rec])))


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_response_record_is_the_page_replay_reads(tmp_path: Path, gzipped: bool) -> None:
    rec = response(Resp("http://a.example/", HTML, headers=[("X-A", "1")]))
    page = one(gzip.compress(rec) if gzipped else rec, position=12345)
    (replayed,) = as_file(tmp_path, rec)
    assert isinstance(page, Page) and isinstance(replayed, Page)
    assert page.position == 12345 and page.source == "t/0/7"
    assert (page.url, page.body, page.headers, page.status, page.fetched_at) == (
        replayed.url, replayed.body, replayed.headers, replayed.status, replayed.fetched_at)
    assert page.body == HTML and page.status == 200


def test_a_resource_record_with_html_is_a_page_in_both(tmp_path: Path) -> None:
    rec = warc_record("resource", HTML, url="http://snap.example/", content_type="text/html")
    page = one(rec)
    (replayed,) = as_file(tmp_path, rec)
    assert isinstance(page, Page) and page.body == HTML and page.url == "http://snap.example/"
    assert isinstance(replayed, Page) and replayed.body == page.body
    log = warc_record("resource", b"a log line\n", url="metadata://x/wget.log",
                      content_type="text/plain")
    assert one(log) == Skipped("non-html", "t/0/7")


def test_a_revisit_record_is_a_recrawl_page() -> None:
    page = one(revisit("http://a.example/"))
    assert isinstance(page, Page) and page.revisit is not None and page.body == b""
    assert page.revisit.profile.endswith("identical-payload-digest")


@pytest.mark.parametrize(("rec", "kind"), [
    (warcinfo(), "warcinfo"),
    (request("http://a.example/"), "request"),
    (metadata("http://a.example/"), "metadata"),
    (warc_record("conversion", b"text", url="http://a.example/", content_type="text/plain"),
     "conversion"),
    (warc_record("continuation", b"rest", url="http://a.example/"), "continuation"),
    (warc_record("revisit", b"", url="http://a.example/",
                 headers=[("WARC-Profile", "http://example.org/own-profile")]), "revisit"),
    (response(Resp("http://a.example/i.png", b"\x89PNG", content_type="image/png")),
     "non-html"),
])
def test_records_that_are_not_pages_are_skipped_by_type(rec: bytes, kind: str) -> None:
    assert one(rec) == Skipped(kind, "t/0/7")
    assert one(gzip.compress(rec)) == Skipped(kind, "t/0/7")


GOOD = response(Resp("http://a.example/", HTML))
NO_URI = warc_record("response", http_block(Resp("http://x/", HTML)),
                     content_type="application/http; msgtype=response")
NOT_HTTP = warc_record("response", b"<html>no status line</html>", url="http://a.example/",
                       content_type="application/http; msgtype=response")
NO_LENGTH = GOOD.replace(b"Content-Length:", b"Content-Lenght:", 1)


@pytest.mark.parametrize(("value", "kind"), [
    (b'{"url": "http://a.example/", "html": "<p>json</p>"}', "not-warc"),
    (gzip.compress(b"<html>gzipped, not a record</html>"), "not-warc"),
    (GOOD[:len(GOOD) // 2], "truncated"),
    (gzip.compress(GOOD)[:-40], "truncated"),
    (GOOD[:30], "truncated"),  # cut inside the WARC header
    # a gzip header, then a deflate block of the reserved type 11 (0xff): refused at once,
    # whatever the record (cut later, its random record id made it "truncated" 5 % of runs)
    (gzip.compress(GOOD)[:10] + b"\xff" * 64, "bad-gzip"),
    (gzip.compress(GOOD)[:12], "truncated"),
    (gzip.compress(GOOD) + b"trailing junk", "bad-gzip"),
    (NO_URI, "no-url"),
    (NOT_HTTP, "bad-http"),
    (NO_LENGTH, "bad-record"),
    (GOOD + response(Resp("http://b.example/", HTML)), "multiple-records"),
    (gzip.compress(GOOD) + gzip.compress(GOOD), "multiple-records"),
    (gzip.compress(GOOD + request("http://a.example/")), "multiple-records"),
    (GOOD + b"junk after the record\r\n", "bad-record"),
])
def test_bad_input_is_a_reject_of_its_own_kind_with_the_value(value: bytes, kind: str) -> None:
    out = one(value)
    assert isinstance(out, Rejected), out
    assert (out.kind, out.source, out.raw) == (kind, "t/0/7", value), out.message
    assert out.message


def test_a_truncated_gzip_member_names_its_record_url() -> None:
    out = one(gzip.compress(GOOD)[:-40])
    assert isinstance(out, Rejected) and out.url == "http://a.example/"


def test_a_record_that_inflates_past_the_limit_is_too_large() -> None:
    big = response(Resp("http://a.example/", b"<p>" + b"a" * 300_000))
    out = page_from_warc(gzip.compress(big), "t/0/7", max_bytes=100_000)
    assert isinstance(out, Rejected) and out.kind == "too-large"
    assert isinstance(page_from_warc(gzip.compress(big), "t/0/7", max_bytes=400_000), Page)


def test_the_kafka_dispatch_reads_warc_values() -> None:
    rec = gzip.compress(GOOD)
    page = page_from_message(rec, None, [], "t/0/7", input_format="warc", max_bytes=LIMIT,
                             position=99)
    assert isinstance(page, Page) and page.position == 99 and page.url == "http://a.example/"
    skipped = page_from_message(request("http://a/"), b"k", [], "t/0/8", input_format="warc",
                                max_bytes=LIMIT)
    assert skipped == Skipped("request", "t/0/8")
    tombstone = page_from_message(None, b"k", [], "t/0/9", input_format="warc",
                                  max_bytes=LIMIT)
    assert isinstance(tombstone, Rejected) and tombstone.kind == "no-body"


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpora/warc is absent")
def test_every_corpus_record_as_a_message_is_what_replay_reads() -> None:
    """Each record of every real WARC file that can be cut into records, as one message:
    the same pages, revisits and rejects as replay's reading of the file, in order, and the
    skipped records are the file's skipped ones."""
    from stream_dedup.sources.stats import SourceStats
    compared = 0
    for path in sorted(p for p in CORPUS.rglob("*.warc*") if p.is_file()):
        try:
            values = [value for _, value in record_bytes(path)]
        except ValueError:
            continue  # not cut into records (damaged, one gzip stream): replay reads it
        out = [one(v) for v in values]
        stats = SourceStats()
        replayed = list(iter_archive(path, stats))
        ours = [o for o in out if not isinstance(o, Skipped)]
        assert [(type(o), o.url, getattr(o, "body", None), getattr(o, "kind", None),
                 getattr(o, "revisit", None), getattr(o, "fetched_at", None))
                for o in ours] == [
                (type(o), o.url, getattr(o, "body", None), getattr(o, "kind", None),
                 getattr(o, "revisit", None), getattr(o, "fetched_at", None))
                for o in replayed], path
        assert Counter(o.kind for o in out if isinstance(o, Skipped)) == stats.skipped, path
        compared += len(values)
    assert compared > 5000


# --- the runner: skipped records get no decision and are committed -------------------------
def warc_records(tp: TopicPartition, values: list[bytes]) -> list:  # type: ignore[type-arg]
    return [record(tp, i, v) for i, v in enumerate(values)]


def test_skipped_records_are_committed_without_a_decision() -> None:
    """A batch of skipped records only (the second, of 3) commits too: nothing stuck."""
    tp = TopicPartition("pages", 0)
    values = [warcinfo(), request("http://a/"), response(Resp("http://a/", HTML)),
              metadata("http://a/"), request("http://b/"), metadata("http://b/"),
              gzip.compress(response(Resp("http://b/", HTML))), b"not a record"]
    settings = Settings(batch_size=3, input_format="warc")

    async def go() -> tuple[FakeProducer, FakeConsumer, Runner, Metrics]:
        stop = asyncio.Event()
        consumer = FakeConsumer({tp: warc_records(tp, values)}, [tp], stop)
        producer = FakeProducer()
        dedup = Deduplicator(settings)
        metrics = Metrics(settings, process=False)
        source = KafkaSource(settings, consumer, dedup.index, metrics)  # type: ignore[arg-type]
        sink = KafkaSink(settings, producer, metrics)  # type: ignore[arg-type]
        runner = Runner(settings, dedup, source, sink, metrics=metrics)
        await source.listener.on_partitions_assigned([tp])
        await runner.run(stop)
        return producer, consumer, runner, metrics

    producer, consumer, runner, metrics = asyncio.run(go())
    decisions = producer.decisions()
    assert [(d["url"], d["decision"], d["reason"], d["source"]) for d in decisions] == [
        ("http://a/", "keep", "unique", "pages/0/2"),
        ("http://b/", "drop", "exact", "pages/0/6"),
        (None, "reject", "not-warc", "pages/0/7")]
    assert consumer.committed == {tp: len(values)}
    assert runner.stats.skipped == {"warcinfo": 1, "request": 2, "metadata": 2}
    assert runner.stats.records == runner.stats.committed == len(values)
    dead = [v for t, v, _ in producer.sent if t == "pages-dead-letter"]
    assert dead == [b"not a record"]
    for kind, n in runner.stats.skipped.items():
        assert metrics.registry.get_sample_value("stream_dedup_skipped_records_total",
                                                 {"type": kind}) == n
    json.dumps(runner.stats.skipped)


def test_a_made_up_record_type_is_counted_as_other() -> None:
    metrics = Metrics(Settings(), process=False)
    metrics.skipped_records("x-my-own-type", 2)
    assert metrics.registry.get_sample_value("stream_dedup_skipped_records_total",
                                             {"type": "other"}) == 2
