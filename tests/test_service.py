"""The Kafka service against a real broker: kcat in, `stream-dedup serve`, kcat out."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import MessageSizeTooLargeError, RecordTooLargeError
from aiokafka.partitioner import DefaultPartitioner
from opskit import wait_for
from schemakit import decision_of

from stream_dedup.cli.sample import SamplePage, build
from stream_dedup.config import Settings
from stream_dedup.kafka.client import make_producer, outcome, send_batched, send_now

pytestmark = pytest.mark.kafka


# --- helpers -----------------------------------------------------------------------------
def names(prefix: str = "t") -> dict[str, str]:
    tag = f"{prefix}-{uuid.uuid4().hex[:10]}"
    return {"input": f"{tag}-pages", "decisions": f"{tag}-decisions", "kept": f"{tag}-kept",
            "dead": f"{tag}-dead", "group": f"{tag}-group"}


def create_topics(bootstrap: str, topics: list[str], partitions: int) -> None:
    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(t, partitions, 1) for t in topics])
        finally:
            await admin.close()
    asyncio.run(go())


def kcat_produce(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    """key<TAB>value lines (values must be one line: JSON is)."""
    data = b"".join(k.encode() + b"\t" + v + b"\n" for k, v in records)
    subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-K", "\t", "-z", "none"],
                   input=data, check=True, timeout=60)


def kcat_produce_file(bootstrap: str, topic: str, path: Path, key: str,
                      headers: tuple[str, ...] = ()) -> None:
    """One message whose value is the whole file (binary-safe)."""
    cmd = ["kcat", "-P", "-b", bootstrap, "-t", topic, "-k", key]
    for h in headers:
        cmd += ["-H", h]
    subprocess.run([*cmd, str(path)], check=True, timeout=60)


def kcat_consume(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e",
                          "-J", "-q"], capture_output=True, timeout=60)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def decisions_of(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """The decisions on a topic, each checked against docs/decision.schema.json."""
    return [decision_of(m["payload"]) for m in kcat_consume(bootstrap, topic)]


def page_message(p: SamplePage) -> tuple[str, bytes]:
    return p.url, json.dumps({"url": p.url, "html": p.html}).encode()


class Service:
    """`python -m stream_dedup serve` as a child process (so it can be killed for real)."""

    def __init__(self, bootstrap: str, t: dict[str, str], log: Path, *extra: str,
                 env: dict[str, str] | None = None, own_group: bool = False) -> None:
        self.log = log
        cmd = [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers", bootstrap,
               "--input-topic", t["input"], "--decisions-topic", t["decisions"],
               "--kept-topic", t["kept"], "--dead-letter-topic", t["dead"],
               "--group-id", t["group"], "--http-port", "0", *extra]  # extra may override
        self.fh = open(log, "ab")  # noqa: SIM115
        # own_group: a process group of its own, to be signalled as a whole (os.killpg)
        self.proc = subprocess.Popen(cmd, stdout=self.fh, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})},
                                     process_group=0 if own_group else None)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait(timeout)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.fh.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def service(kafka_bootstrap: str, tmp_path: Path, request):  # type: ignore[no-untyped-def]
    started: list[Service] = []
    request.node.services = started  # their logs are shown when the test fails (conftest.py)

    def start(t: dict[str, str], *extra: str, log: str = "serve.log",
              env: dict[str, str] | None = None, own_group: bool = False) -> Service:
        svc = Service(kafka_bootstrap, t, tmp_path / log, *extra, env=env, own_group=own_group)
        started.append(svc)
        return svc

    yield start
    for svc in started:
        svc.stop(signal.SIGKILL)


def committed_and_end(bootstrap: str, topic: str, group: str) -> tuple[int, int]:
    async def go() -> tuple[int, int]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False)
        await c.start()
        try:
            tps = await _partitions(c, topic)
            end = await c.end_offsets(tps)
            committed = [await c.committed(tp) or 0 for tp in tps]
            return sum(committed), sum(end.values())
        finally:
            await c.stop()
    return asyncio.run(go())


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    parts = await consumer.partitions_for(topic) if hasattr(consumer, "partitions_for") else None
    if not parts:
        await consumer._client.force_metadata_update()
        parts = consumer.partitions_for_topic(topic)
    assert parts, f"topic {topic} has no partitions"
    return [TopicPartition(topic, p) for p in sorted(parts)]


# --- tests -------------------------------------------------------------------------------
def test_send_now_sends_without_waiting_for_the_linger(kafka_bootstrap: str) -> None:
    """The sink sends a batch's outputs, then waits for their acks: send_now hands them to
    the producer's sender at once. With a linger of 60 s the acks still come within 10 s,
    and what is sent after it (into a new record batch) goes too."""
    topic = names("linger")["input"]
    create_topics(kafka_bootstrap, [topic], partitions=1)

    async def go() -> list[int]:
        producer = make_producer(Settings(bootstrap_servers=kafka_bootstrap), lambda: None,
                                 linger_ms=60_000)
        await producer.start()
        try:
            offsets = []
            for batch in ([b"a", b"b", b"c"], [b"d"]):
                acks = [await producer.send(topic, value) for value in batch]
                send_now(producer)
                metas = await asyncio.wait_for(asyncio.gather(*acks), 10.0)
                offsets += [m.offset for m in metas]
            return offsets
        finally:
            await producer.stop()

    assert asyncio.run(go()) == [0, 1, 2, 3]


def test_send_batched_partitions_by_key_keeps_order_and_fails_only_a_refused_batch(
        kafka_bootstrap: str) -> None:
    """send_batched (KafkaSink's path): each message on its key's partition (murmur2, as
    `send`), in order within it, headers kept, in few record batches; a record the topic
    refuses (larger than its max.message.bytes) fails alone, in a batch of its own; with a
    linger of 60 s every ack within 30 s. (The batches after it in its partition are
    refused as out of sequence by the idempotent broker: KafkaSink sends them again from a
    new producer, tests/test_runner.py.)"""
    topic = names("batched")["input"]

    async def go() -> tuple[list[Any], list[Any]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 3, 1,
                                                topic_configs={"max.message.bytes": "2000"})])
        finally:
            await admin.close()
        producer = make_producer(Settings(bootstrap_servers=kafka_bootstrap), lambda: None,
                                 max_batch=2000, linger_ms=60_000)
        await producer.start()
        try:
            acks = await send_batched(producer, sends)
            _, late = await asyncio.wait({a for a in acks if isinstance(a, asyncio.Future)},
                                         timeout=30)
            assert not late
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, p) for p in range(3)])
            got: list[Any] = []
            deadline = time.monotonic() + 30
            while len(got) < len(sends) - 1 and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got += records
        finally:
            await consumer.stop()
        return acks, got

    def partition(key: bytes) -> int:
        return DefaultPartitioner()(key, [0, 1, 2], [0, 1, 2])  # type: ignore[no-any-return]

    sends = [(topic, f"k{i}".encode(), f"v{i}-".encode() * 30, [("n", str(i).encode())])
             for i in range(40)]
    big = 1 + max(i for i in range(40) if partition(f"k{i}".encode()) == partition(b"big"))
    sends.insert(big, (topic, b"big", b"x" * 5000, []))  # the last of its partition
    acks, got = asyncio.run(go())
    assert isinstance(outcome(acks[big]), (MessageSizeTooLargeError, RecordTooLargeError))
    assert [outcome(a) is None for a in acks] == [key != b"big" for _, key, _, _ in sends]
    assert len({id(a) for a in acks}) < len(acks) // 3  # ~10 records a batch
    for p in range(3):
        mine = [r for r in got if r.partition == p]
        assert [r.key for r in mine] == [
            key for _, key, _, _ in sends if key != b"big" and partition(key) == p]
        assert all(r.headers == (("n", r.key[1:]),) for r in mine)


def test_pages_in_decisions_out(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]
    t = names()
    create_topics(kafka_bootstrap, [t["input"]], partitions=1)
    pages = build(seed=21)
    kcat_produce(kafka_bootstrap, t["input"], [page_message(p) for p in pages])
    svc = service(t, "--batch-size", "16")
    wait_for("decisions", lambda: len(kcat_consume(kafka_bootstrap, t["decisions"])) >= len(pages))
    assert svc.stop() == 0
    got = decisions_of(kafka_bootstrap, t["decisions"])
    assert [(d["url"], d["decision"], d["reason"]) for d in got] == [
        (p.url, *p.expected) for p in pages]
    assert [d["source"] for d in got] == [f"{t['input']}/0/{i}" for i in range(len(pages))]
    kept = kcat_consume(kafka_bootstrap, t["kept"])
    assert [m["key"] for m in kept] == [d["url"] for d in got if d["decision"] == "keep"]
    assert json.loads(kept[0]["payload"])["html"] == pages[0].html  # the original message
    assert "stopped after" in svc.text()


def test_recrawls_over_kafka(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]
    """A URL fetched again: unchanged pages stay off the kept topic, a new version goes to
    it, and every decision says which version it was compared with."""
    t = names()
    create_topics(kafka_bootstrap, [t["input"]], partitions=1)
    v1, v2 = (" ".join(f"{tag}{k}x" for k in range(300)) for tag in ("w", "v"))
    fetches = [("https://r.example/a", v1, "2026-11-01T00:00:00Z"),
               ("https://r.example/a#top", v1, "2026-11-02T00:00:00Z"),
               ("https://r.example/a", v2, "2026-11-03T00:00:00Z"),
               ("https://R.example:443/a", v2, "2026-11-04T00:00:00Z")]
    kcat_produce(kafka_bootstrap, t["input"], [(url, json.dumps(
        {"url": url, "html": f"<p>{text}</p>", "fetched_at": when}).encode())
        for url, text, when in fetches])
    svc = service(t, "--batch-size", "2")
    wait_for("decisions", lambda: len(kcat_consume(kafka_bootstrap, t["decisions"])) >= 4)
    assert svc.stop() == 0
    got = decisions_of(kafka_bootstrap, t["decisions"])
    assert [(d["decision"], d["reason"]) for d in got] == [
        ("keep", "unique"), ("drop", "unchanged"), ("keep", "changed"), ("drop", "unchanged")]
    assert [d["fetched_at"] for d in got] == [when for _, _, when in fetches]
    assert got[1]["previous"]["page_id"] == got[2]["previous"]["page_id"] == got[0]["page_id"]
    assert got[3]["previous"]["page_id"] == got[2]["page_id"]
    # clusters: a kept page is its own, an unchanged recrawl joins its URL's version's
    assert [d["cluster"] for d in got] == [got[0]["page_id"]] * 2 + [got[2]["page_id"]] * 2
    assert got[1]["payload_digest"].startswith("sha1:")
    kept = kcat_consume(kafka_bootstrap, t["kept"])
    assert [json.loads(m["payload"])["fetched_at"] for m in kept] == [
        fetches[0][2], fetches[2][2]]


def test_missing_topics_are_created_at_start_and_said(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]
    """No topic exists yet: serve creates all four before it subscribes, one line each, and
    the first page goes through without an ERROR about missing metadata."""
    t = names()
    svc = service(t)
    wait_for("consuming", lambda: "connected; consuming" in svc.text())
    for topic in (t["input"], t["decisions"], t["kept"], t["dead"]):
        assert f"created topic {topic} " in svc.text()
    kcat_produce(kafka_bootstrap, t["input"], [page_message(build(seed=25)[0])])
    wait_for("decision", lambda: len(kcat_consume(kafka_bootstrap, t["decisions"])) == 1)
    assert svc.stop() == 0
    assert "not found in cluster metadata" not in svc.text()
    assert " ERROR " not in svc.text()


def test_order_per_partition_and_one_decision_per_page(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]
    t = names()
    create_topics(kafka_bootstrap, [t["input"]], partitions=3)
    pages = build(seed=22) + build(seed=23)
    kcat_produce(kafka_bootstrap, t["input"], [page_message(p) for p in pages])
    svc = service(t, "--batch-size", "25", "--workers", "2")
    wait_for("decisions", lambda: len(kcat_consume(kafka_bootstrap, t["decisions"])) >= len(pages))
    assert svc.stop() == 0
    got = decisions_of(kafka_bootstrap, t["decisions"])
    sources = [d["source"] for d in got]
    assert len(sources) == len(set(sources)) == len(pages)
    by_partition: dict[str, list[int]] = {}
    for s in sources:
        _, part, offset = s.rsplit("/", 2)
        by_partition.setdefault(part, []).append(int(offset))
    assert len(by_partition) == 3
    for offsets in by_partition.values():
        assert offsets == sorted(offsets) == list(range(len(offsets)))


def test_bad_messages_go_to_the_dead_letter_topic(kafka_bootstrap: str, service,
                                                  tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    t = names()
    create_topics(kafka_bootstrap, [t["input"]], partitions=1)
    good = build(seed=24)[0:3:2]  # two different articles
    b = kafka_bootstrap
    kcat_produce(b, t["input"], [page_message(good[0]),
                                 ("k1", b"{not json"),
                                 ("k2", b'{"html": "<p>no url</p>"}'),
                                 ("k3", b'{"url": "http://x/b64", "body_b64": "%%%notbase64"}')])
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(bytes(random.Random(1).randrange(256) for _ in range(3000)))
    kcat_produce_file(b, t["input"], garbage, "k4")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"url": "http://x/big", "html": "<p>" + "word " * 20000 + "</p>"}))
    kcat_produce_file(b, t["input"], big, "k5")
    kcat_produce(b, t["input"], [page_message(good[1])])
    svc = service(t, "--max-page-bytes", "60000")
    wait_for("7 decisions", lambda: len(kcat_consume(b, t["decisions"])) >= 7)
    assert svc.stop() == 0
    got = decisions_of(b, t["decisions"])
    assert [(d["decision"], d["reason"]) for d in got] == [
        ("keep", "unique"), ("reject", "bad-json"), ("reject", "no-url"),
        ("reject", "bad-base64"), ("reject", "bad-json"), ("reject", "too-large"),
        ("keep", "unique")]
    dead = kcat_consume(b, t["dead"])
    assert [m["key"] for m in dead] == ["k1", "k2", "k3", "k4", "k5"]
    errors = [dict(zip(m["headers"][::2], m["headers"][1::2], strict=True)) for m in dead]
    assert [e["stream-dedup-error"] for e in errors] == [
        "bad-json", "no-url", "bad-base64", "bad-json", "too-large"]
    assert all(e["stream-dedup-source"].startswith(t["input"] + "/0/") for e in errors)
    assert dead[0]["payload"] == "{not json"  # the original bytes


def test_html_input_format(kafka_bootstrap: str, service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    t = names()
    create_topics(kafka_bootstrap, [t["input"]], partitions=1)
    page = build(seed=25)[0]
    html = tmp_path / "page.html"
    html.write_bytes(page.html.encode("utf-8"))
    for url in ("http://h/1", "http://h/2"):
        kcat_produce_file(kafka_bootstrap, t["input"], html, url,
                          ("content-type=text/html; charset=utf-8", "fetched-at=2026-01-01"))
    svc = service(t, "--input-format", "html")
    wait_for("2 decisions", lambda: len(kcat_consume(kafka_bootstrap, t["decisions"])) >= 2)
    assert svc.stop() == 0
    got = decisions_of(kafka_bootstrap, t["decisions"])
    assert [(d["url"], d["reason"]) for d in got] == [("http://h/1", "unique"),
                                                      ("http://h/2", "exact")]


def test_graceful_shutdown_commits_what_was_decided(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]
    t = names()
    create_topics(kafka_bootstrap, [t["input"]], partitions=2)
    pages = build(seed=26)
    kcat_produce(kafka_bootstrap, t["input"], [page_message(p) for p in pages])
    svc = service(t, "--batch-size", "10")
    wait_for("decisions", lambda: len(kcat_consume(kafka_bootstrap, t["decisions"])) >= len(pages))
    assert svc.stop(signal.SIGTERM) == 0
    committed, end = committed_and_end(kafka_bootstrap, t["input"], t["group"])
    assert committed == end == len(pages)
    # Nothing is delivered again after a clean stop: a marker page produced after the
    # restart is the next decision, so every record before it was skipped (not waited for).
    marker = build(seed=27)[0]
    again = service(t, log="again.log")
    kcat_produce(kafka_bootstrap, t["input"], [page_message(marker)])
    wait_for("the marker's decision",
             lambda: len(kcat_consume(kafka_bootstrap, t["decisions"])) > len(pages))
    assert again.stop() == 0
    got = decisions_of(kafka_bootstrap, t["decisions"])
    assert len(got) == len(pages) + 1 and got[-1]["url"] == marker.url


def _crash_topic(kafka_bootstrap: str, seeds: int = 6) -> dict[str, str]:
    t = names()
    create_topics(kafka_bootstrap, [t["input"]], partitions=2)
    pages = [p for seed in range(30, 30 + seeds) for p in build(seed=seed)]
    seen: set[str] = set()  # past ~20 seeds, two crawls may share a tag page's URL: once
    pages = [p for p in pages if not (p.url in seen or seen.add(p.url))]
    kcat_produce(kafka_bootstrap, t["input"], [page_message(p) for p in pages])
    return t


@pytest.mark.slow
def test_sigkill_at_random_points_loses_nothing(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]
    t = _crash_topic(kafka_bootstrap)
    rng = random.Random(1201)
    for round_ in range(3):  # killed three times at a random moment while pages flow
        svc = service(t, "--batch-size", "40", log=f"run{round_}.log")
        wait_for("the first decision of this run", lambda s=svc: "partitions assigned" in s.text())
        time.sleep(rng.uniform(0.2, 2.0))
        svc.stop(signal.SIGKILL)
    final = service(t, "--batch-size", "40", log="final.log")
    _every_page_decided_once_at_least(kafka_bootstrap, t)
    # The killed runs may have decided every page: stopped before its signal handlers are
    # set (still importing), the last one would die of the SIGTERM instead of exiting 0.
    wait_for("consuming", lambda: "partitions assigned" in final.text())
    assert final.stop() == 0


@pytest.mark.slow
def test_crash_between_acks_and_commit_redelivers_without_self_duplicates(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]
    t = _crash_topic(kafka_bootstrap)
    crashed = service(t, "--batch-size", "30", "--crash-at", "before-index-commit:3",
                      log="crash.log")
    assert crashed.wait(timeout=90) == 70
    final = service(t, "--batch-size", "30", log="final.log")
    redelivered = _every_page_decided_once_at_least(kafka_bootstrap, t)
    assert final.stop() == 0
    assert redelivered == 30  # the third batch: sent, acknowledged, never committed


def _every_page_decided_once_at_least(kafka_bootstrap: str, t: dict[str, str]) -> int:
    expected_sources = {f"{t['input']}/{part}/{off}" for part, off in _layout(
        kafka_bootstrap, t["input"])}

    # Slow is not stuck (CI's machines are): it fails when no page was decided for 60 s.
    left, stalled = len(expected_sources), time.monotonic() + 60
    while left:
        got = {d["source"] for d in decisions_of(kafka_bootstrap, t["decisions"])}
        now_left = len(expected_sources - got)
        if now_left < left:
            left, stalled = now_left, time.monotonic() + 60
        assert left == 0 or time.monotonic() < stalled, \
            f"no page decided for 60 s with {left} of {len(expected_sources)} undecided"
        time.sleep(0.3)
    got = decisions_of(kafka_bootstrap, t["decisions"])
    by_source: dict[str, list[dict[str, Any]]] = {}
    for d in got:
        by_source.setdefault(d["source"], []).append(d)
    assert set(by_source) == expected_sources
    for ds in by_source.values():
        for d in ds:  # a re-delivered page is never a duplicate of itself
            assert d["duplicate_of"] is None or d["duplicate_of"]["url"] != d["url"]
    return sum(len(ds) > 1 for ds in by_source.values())


def _layout(bootstrap: str, topic: str) -> list[tuple[int, int]]:
    async def go() -> list[tuple[int, int]]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await c.start()
        try:
            tps = await _partitions(c, topic)
            end = await c.end_offsets(tps)
            return [(tp.partition, o) for tp in tps for o in range(end[tp])]
        finally:
            await c.stop()
    return asyncio.run(go())


def test_unreachable_broker_is_retried_and_said(service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    t = names()
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "down.log"
    svc = Service(f"127.0.0.1:{port}", t, log)
    try:
        wait_for("a retry message", lambda: "retrying in" in log.read_text(), timeout=60)
        assert svc.proc.poll() is None  # still trying, not exited
    finally:
        code = svc.stop()
    assert code == 0
    assert "Connect" in log.read_text() or "connect" in log.read_text()


def test_replay_to_kafka_feeds_the_input_topic(kafka_bootstrap: str, tmp_path: Path) -> None:
    from stream_dedup.cli.sample import write_sample

    t = names()
    warc, jsonl, pages = write_sample(tmp_path / "crawl")
    out = subprocess.run([sys.executable, "-m", "stream_dedup", "replay", str(warc), str(jsonl),
                          "--to-kafka", t["input"], "--bootstrap-servers", kafka_bootstrap],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    msgs = kcat_consume(kafka_bootstrap, t["input"])
    assert [m["key"] for m in msgs] == [p.url for p in pages]
    first = json.loads(msgs[0]["payload"])
    assert base64.b64decode(first["body_b64"]).decode() == pages[0].html
    # the line that is not JSON, and the revisit record (a page message cannot say "revisit")
    assert "2 input records not sent" in out.stderr


@pytest.mark.slow
def test_rebalance_mid_stream_loses_nothing(kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]
    """A second instance joins while the first is busy: partitions move, nothing is lost."""
    t = _crash_topic(kafka_bootstrap, seeds=2)
    first = service(t, "--batch-size", "10", log="a.log")
    wait_for("some decisions", lambda: len(kcat_consume(kafka_bootstrap, t["decisions"])) >= 40)
    second = service(t, "--batch-size", "10", log="b.log")
    seed = 100
    deadline = time.monotonic() + 90
    while not re.search(r"partitions assigned: \['", second.text()):  # keep the first busy
        assert time.monotonic() < deadline, "the second instance never got a partition"
        kcat_produce(kafka_bootstrap, t["input"], [page_message(p) for p in build(seed=seed)])
        seed += 1
    for extra in range(seed, seed + 2):  # and some more for both of them
        kcat_produce(kafka_bootstrap, t["input"], [page_message(p) for p in build(seed=extra)])
    _every_page_decided_once_at_least(kafka_bootstrap, t)
    assert first.stop() == 0 and second.stop() == 0
    assert re.search(r"partitions revoked: \['", first.text())  # it gave a partition away
    done = re.search(r"stopped after (\d+) records", second.text())
    assert done and int(done.group(1)) > 0  # and the newcomer decided pages
    committed, end = committed_and_end(kafka_bootstrap, t["input"], t["group"])
    assert committed == end


@pytest.mark.slow
def test_lsm_index_makes_crashes_invisible_in_the_decisions(
        kafka_bootstrap: str, service, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL `serve --index lsm` several times mid-stream: after the last restart every
    page has a decision, each page's decisions agree, and they equal an uninterrupted run."""
    from stream_dedup import Deduplicator, Settings

    t = names()
    create_topics(kafka_bootstrap, [t["input"]], partitions=1)
    pages = [p for seed in range(50, 60) for p in build(seed=seed)]
    kcat_produce(kafka_bootstrap, t["input"], [page_message(p) for p in pages])
    index = tmp_path / "index"
    lsm = ("--index", "lsm", "--index-path", str(index), "--batch-size", "20")
    rng = random.Random(1202)
    for round_ in range(3):
        svc = service(t, *lsm, log=f"run{round_}.log")
        wait_for("consuming", lambda s=svc: "partitions assigned" in s.text())
        time.sleep(rng.uniform(0.3, 2.0))
        svc.stop(signal.SIGKILL)
    final = service(t, *lsm, log="final.log")
    _every_page_decided_once_at_least(kafka_bootstrap, t)
    wait_for("the last run to resume", lambda: "partitions assigned" in final.text())
    assert final.stop() == 0

    def key(d: dict[str, Any]) -> tuple[Any, ...]:
        return (d["decision"], d["reason"], d["page_id"],
                d["duplicate_of"] and d["duplicate_of"]["url"])

    by_offset: dict[int, set[tuple[Any, ...]]] = {}
    for d in decisions_of(kafka_bootstrap, t["decisions"]):
        by_offset.setdefault(int(d["source"].rsplit("/", 1)[1]), set()).add(key(d))
    # A record's decisions are one and the same, page id included (a Kafka page's id is its
    # position); apart from the ids, they are those of an uninterrupted run.
    assert [len(by_offset[i]) for i in range(len(pages))] == [1] * len(pages)
    got = [next(iter(by_offset[i])) for i in range(len(pages))]
    uninterrupted = Deduplicator(Settings())
    expected = [key(uninterrupted.check_html(p.url, p.html).to_dict()) for p in pages]
    assert [(*g[:2], g[3]) for g in got] == [(*e[:2], e[3]) for e in expected]
    assert "resuming at offset" in (tmp_path / "final.log").read_text()
