"""The runner's Kafka edges over in-process stand-ins for aiokafka's clients (a scripted
consumer and producer); the rest is the real one: KafkaSource, KafkaSink, Runner,
Deduplicator, the LSM index on disk."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    KafkaConnectionError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    TopicAuthorizationFailedError,
)
from aiokafka.structs import ConsumerRecord
from opskit import _WORDS, free_redis_ports, html

from stream_dedup import Deduplicator, Page, Settings
from stream_dedup.errors import IndexUnavailable, KafkaDeliveryError
from stream_dedup.http.app import ApiState
from stream_dedup.index import MemoryIndex
from stream_dedup.kafka.edges import KafkaSink, KafkaSource
from stream_dedup.metrics import Metrics
from stream_dedup.models import Decision
from stream_dedup.runner.edges import Crash, Faults, ListSink, ListSource
from stream_dedup.runner.loop import STEPS, Runner


class FakeConsumer:
    """Partitions of records; getmany drains them in `order`, as a fetch might, and waits
    a little when there is nothing (as a fetch waits for records). Everything committed is
    the end of the input: `stop` is set."""

    def __init__(self, records: dict[TopicPartition, list[ConsumerRecord]],
                 order: list[TopicPartition], stop: asyncio.Event) -> None:
        self.records, self.order, self.stop = records, order, stop
        self.pos = dict.fromkeys(records, 0)
        self.committed: dict[TopicPartition, int] = {}
        self._subscription = SimpleNamespace(reassignment_in_progress=False)  # as aiokafka's

    def assignment(self) -> set[TopicPartition]:
        return set(self.records)

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        for tp in self.order:
            take = self.records[tp][self.pos[tp]:self.pos[tp] + max_records]
            if take:
                out[tp] = take
                self.pos[tp] += len(take)
                max_records -= len(take)
            if not max_records:
                break
        if not out:
            await asyncio.sleep(min(timeout_ms, 10) / 1000)
        return out

    async def position(self, tp: TopicPartition) -> int:
        return self.pos[tp]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos[tp] = offset

    def highwater(self, tp: TopicPartition) -> int:
        return len(self.records[tp])

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.committed.update(offsets)
        if all(self.committed.get(tp, 0) >= len(r) for tp, r in self.records.items()):
            self.stop.set()


class FakeProducer:
    """Acknowledges every send, after failing the first ones with `failures` (in order)."""

    def __init__(self, failures: Iterable[BaseException] = ()) -> None:
        self.failures = list(failures)
        self.sent: list[tuple[str, bytes, dict[str, bytes]]] = []
        self.attempts = 0

    async def send(self, topic: str, value: bytes, key: bytes | None = None,
                   headers: list[tuple[str, bytes]] | None = None) -> asyncio.Future[None]:
        self.attempts += 1
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.failures:
            ack.set_exception(self.failures.pop(0))
        else:
            self.sent.append((topic, value, dict(headers or ())))
            ack.set_result(None)
        return ack

    def decisions(self) -> list[dict[str, Any]]:
        return [json.loads(v) for t, v, _ in self.sent if t == "decisions"]


def record(tp: TopicPartition, offset: int, value: bytes) -> ConsumerRecord:
    return ConsumerRecord(tp.topic, tp.partition, offset, 0, 0, None, value, None, 0,
                          len(value), ())


P0, P1 = TopicPartition("pages", 0), TopicPartition("pages", 1)


def pair_texts(n: int) -> list[tuple[str, str]]:
    """n articles, each with a copy with two words changed (a near-duplicate)."""
    import random
    rng = random.Random(5)
    out = []
    for _ in range(n):
        words = [rng.choice(_WORDS) for _ in range(400)]
        edited = list(words)
        for j in rng.sample(range(len(words)), 2):
            edited[j] = "zq" + edited[j]
        out.append((html([" ".join(words)]), html([" ".join(edited)])))
    return out


def near_pairs(n: int) -> dict[TopicPartition, list[ConsumerRecord]]:
    """Article i on partition 0 and its copy on partition 1."""
    out: dict[TopicPartition, list[ConsumerRecord]] = {P0: [], P1: []}
    for i, texts in enumerate(pair_texts(n)):
        for tp, text in zip((P0, P1), texts, strict=True):
            page = {"url": f"https://p.example/{i}/{tp.partition}", "html": text}
            out[tp].append(record(tp, i, json.dumps(page).encode()))
    return out


async def run(settings: Settings, records: dict[TopicPartition, list[ConsumerRecord]],
              order: list[TopicPartition], producer: FakeProducer | None = None,
              faults: Faults | None = None) -> tuple[FakeProducer, FakeConsumer]:
    stop = asyncio.Event()
    consumer = FakeConsumer(records, order, stop)
    producer = producer or FakeProducer()
    dedup = Deduplicator(settings)
    metrics = Metrics(settings, process=False)
    source = KafkaSource(settings, consumer, dedup.index, metrics)  # type: ignore[arg-type]
    sink = KafkaSink(settings, producer, metrics)  # type: ignore[arg-type]
    runner = Runner(settings, dedup, source, sink, metrics=metrics, faults=faults)
    await source.listener.on_partitions_assigned(order)
    try:
        await runner.run(stop)
    except Crash:
        pass
    finally:
        dedup.index.close()  # without a commit: what a crash leaves on disk
    return producer, consumer


def test_restart_decides_the_batch_in_flight_in_its_first_order(tmp_path: Path) -> None:
    """First run: partition 0 is fetched before 1, so the originals are kept and the copies
    dropped; it dies after sending those decisions, before committing. The restart fetches
    partition 1 first: deciding what it fetches, in that order, would keep every copy and
    drop every original (the decisions topic contradicting itself, dropped pages on the kept
    topic). It decides the batch again as it was."""
    settings = Settings(index="lsm", index_path=str(tmp_path / "index"), batch_size=40,
                        kept_topic="kept")
    records = near_pairs(10)
    first, _ = asyncio.run(run(settings, records, [P0, P1],
                               faults=Faults("before-index-commit")))
    again, consumer = asyncio.run(run(settings, records, [P1, P0]))
    before = {d["source"]: (d["decision"], d["reason"]) for d in first.decisions()}
    after = {d["source"]: (d["decision"], d["reason"]) for d in again.decisions()}
    assert len(before) == len(after) == 20
    assert after == before
    assert sum(d == "drop" for d, _ in before.values()) >= 8  # most copies are near drops
    assert consumer.committed == {P0: 10, P1: 10}


def test_only_unacknowledged_messages_are_sent_again(tmp_path: Path) -> None:
    settings = Settings(kept_topic="kept", batch_size=100)
    records = near_pairs(3)
    producer = FakeProducer([KafkaConnectionError("down")] * 2)
    producer, consumer = asyncio.run(run(settings, records, [P0, P1], producer))
    sources = [d["source"] for d in producer.decisions()]
    assert sorted(sources) == sorted(set(sources)) and len(sources) == 6  # none twice
    kept = [v for t, v, _ in producer.sent if t == "kept"]
    assert len(kept) == len(set(kept)) == 3
    assert consumer.committed == {P0: 3, P1: 3}


def test_a_message_the_broker_still_refuses_as_too_large_is_sent_at_its_floor() -> None:
    """The broker's limit was lowered after start: the decision goes again in its reduced
    form (still the whole decision as JSON); refused again, the service stops and says why."""
    settings = Settings(kept_topic="kept", batch_size=100)
    records = {P0: [record(P0, 0, json.dumps({"url": "https://a/", "html": html(
        [" ".join(_WORDS[:300])])}).encode())]}
    producer = FakeProducer([MessageSizeTooLargeError()])  # the decision, first try
    producer, consumer = asyncio.run(run(settings, records, [P0], producer))
    (topic, value, headers), = [m for m in producer.sent if m[0] == "decisions"]
    assert json.loads(value)["decision"] == "keep" and "stream-dedup-reduced" in headers
    assert consumer.committed == {P0: 1}
    # the kept page after it in its partition: refused by the broker as out of sequence
    producer = FakeProducer([MessageSizeTooLargeError(), OutOfOrderSequenceNumber()])
    producer, consumer = asyncio.run(run(settings, records, [P0], producer))
    assert sorted(t for t, _, _ in producer.sent) == ["decisions", "kept"]
    assert consumer.committed == {P0: 1}
    producer = FakeProducer([MessageSizeTooLargeError()] * 2)  # no kept topic: both hit it
    with pytest.raises(KafkaDeliveryError, match="max.message.bytes"):
        asyncio.run(run(Settings(batch_size=100), records, [P0], producer))


def test_a_non_retriable_error_stops_with_its_name() -> None:
    settings = Settings(batch_size=100)
    producer = FakeProducer([TopicAuthorizationFailedError()])
    with pytest.raises(KafkaDeliveryError, match="TopicAuthorizationFailed"):
        asyncio.run(run(settings, near_pairs(1), [P0, P1], producer))



# --- the runner over in-process edges: a list source and sink, crash injection as data ----
S0, S1 = "pages/0", "pages/1"
HTML = (("Content-Type", "text/html; charset=utf-8"),)


def page_streams(n: int) -> dict[str, list[Page]]:
    """Article i at position i of pages/0; its copy at position n-1-i of pages/1, so a batch
    that takes the end of pages/0 and the start of pages/1 holds both of some pairs."""
    pairs = pair_texts(n)
    return {S0: [Page(f"https://p.example/{i}/a", one.encode(), HTML)
                 for i, (one, _) in enumerate(pairs)],
            S1: [Page(f"https://p.example/{i}/b", pairs[i][1].encode(), HTML)
                 for i in reversed(range(n))]}


def outcome(d: Decision) -> tuple[object, ...]:
    return d.decision, d.reason, d.page_id, d.duplicate_of


async def run_list(settings: Settings, source: ListSource, sink: ListSink,
                   dedup: Deduplicator, faults: Faults | None = None) -> Runner:
    runner = Runner(settings, dedup, source, sink, faults=faults)
    try:
        await runner.run(asyncio.Event())
    except Crash:
        pass
    finally:
        dedup.index.close()  # without a commit: what a crash leaves on disk
    return runner


def test_every_batch_times_each_of_its_steps() -> None:
    """stream_dedup_batch_step_seconds: one observation a step for every batch committed."""
    settings = Settings(batch_size=12)
    metrics = Metrics(settings, process=False)
    runner = Runner(settings, Deduplicator(settings), ListSource(page_streams(15)), ListSink(),
                    metrics=metrics)
    asyncio.run(runner.run(asyncio.Event()))
    assert runner.stats.batches == 3  # 30 pages
    for step in STEPS:
        assert metrics.registry.get_sample_value("stream_dedup_batch_step_seconds_count",
                                                 {"step": step}) == 3


@pytest.mark.parametrize("inline", [False, True])
def test_index_steps_run_in_their_thread_or_inline_with_the_same_decisions(
        inline: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve keeps its event loop free (a thread for the index steps); replay, whose loop
    serves nothing else, runs them in the loop's thread (Runner inline)."""
    settings = Settings(batch_size=12)
    expected = ListSink()
    asyncio.run(run_list(settings, ListSource(page_streams(15)), expected,
                         Deduplicator(settings)))
    dedup = Deduplicator(settings)
    threads: set[int] = set()
    check = dedup.check_batch

    def checking(*args: object, **kwargs: object) -> object:
        threads.add(threading.get_ident())
        return check(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dedup, "check_batch", checking)
    sink = ListSink()
    runner = Runner(settings, dedup, ListSource(page_streams(15)), sink, inline=inline)
    asyncio.run(runner.run(asyncio.Event()))
    assert (threads == {threading.get_ident()}) == inline and len(threads) == 1
    assert [outcome(d) for d in sink.decisions] == [outcome(d) for d in expected.decisions]


REPEATED = {  # decisions of the crashed batch (the second, of 12 records) out before the crash
    "before-deliver": 0, "mid-deliver": 5, "before-index-commit": 12,
    "before-source-commit": 12,  # ... and again after it, unless the index holds positions
}


@pytest.mark.parametrize("index", ["lsm", "memory"])
@pytest.mark.parametrize("kill", list(REPEATED))
def test_a_crash_at_each_step_loses_nothing(tmp_path: Path, kill: str, index: str) -> None:
    """15 near-duplicate pairs over two streams, batches of 12: the second batch holds the
    last 3 originals and the copies of those 3 first. The process dies at a step of that
    batch and restarts with other batches (5, the streams in the other order). Every page
    gets a decision, the redelivered ones once more for each that was out. With the LSM
    index the restart is invisible: each page gets the decision an uncrashed run gives it,
    and a batch the index holds is not delivered again."""
    streams = page_streams(15)

    def settings(name: str, batch_size: int) -> Settings:
        return Settings(index=index, index_path=str(tmp_path / name) if index == "lsm" else "",
                        batch_size=batch_size)

    expected = ListSink()
    asyncio.run(run_list(settings("reference", 12), ListSource(streams), expected,
                         Deduplicator(settings("reference", 12))))
    want = {d.source: outcome(d) for d in expected.decisions}
    assert len(want) == 30 and sum(o[0] == "drop" for o in want.values()) >= 12

    committed: dict[str, int] = {}
    sink = ListSink(crash_after=12 + 5 if kill == "mid-deliver" else None)
    faults = None if kill == "mid-deliver" else Faults(kill, batch=2)
    first = settings("index", 12)
    crashed = asyncio.run(run_list(first, ListSource(streams, committed), sink,
                                   Deduplicator(first), faults))
    assert crashed.stats.batches == 1
    sink.crash_after = None
    again = settings("index", 5)
    dedup = Deduplicator(again)
    source = ListSource(streams, committed, dedup.index, order=[S1, S0])
    asyncio.run(run_list(again, source, sink, dedup))

    got: dict[str | None, list[tuple[object, ...]]] = {}
    for d in sink.decisions:
        got.setdefault(d.source, []).append(outcome(d))
    assert set(got) == set(want)  # nothing lost
    repeated = sum(len(ds) - 1 for ds in got.values())
    if index == "memory":  # it starts empty: later decisions may differ
        assert repeated == REPEATED[kill]
        assert committed == {S0: 15, S1: 15}
        return
    assert repeated == (0 if kill == "before-source-commit" else REPEATED[kill])
    assert {s: set(ds) for s, ds in got.items()} == {s: {o} for s, o in want.items()}
    reopened = Deduplicator(again)
    assert reopened.index.offsets() == {S0: 15, S1: 15}  # where a restart would resume
    reopened.close()


class FlakyIndex:
    """A memory index that cannot answer (IndexUnavailable, as a shared index raises with a
    node down) for its next `failures` calls."""

    def __init__(self, settings: Settings, failures: int) -> None:
        self.inner = MemoryIndex(settings.params.stamp, settings.max_posting)
        self.failures = failures

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name in ("stats", "close"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.failures > 0:
                self.failures -= 1
                raise IndexUnavailable("127.0.0.1:7001 is down")
            return attr(*args, **kwargs)
        return call


def test_an_unavailable_index_holds_the_batch_until_it_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    """While the index cannot answer, nothing of the batch goes out or is committed, the
    runner says it is not ready (for /readyz) and warns once; then the same batch is decided
    and delivered, as it would have been without the outage."""
    settings = Settings(batch_size=100)
    streams = page_streams(4)
    expected = ListSink()
    asyncio.run(run_list(settings, ListSource(streams), expected, Deduplicator(settings)))

    metrics = Metrics(settings, process=False)
    dedup = Deduplicator(settings, FlakyIndex(settings, failures=4))  # type: ignore[arg-type]
    source, sink = ListSource(streams), ListSink()
    runner = Runner(settings, dedup, source, sink, metrics=metrics)
    api = ApiState(settings, metrics, dedup, index_problem=lambda: runner.index_problem)
    seen: list[tuple[bool, int, int, bool]] = []

    async def go() -> None:
        task = asyncio.create_task(runner.run(asyncio.Event()))
        while not task.done():
            ready = (await api.readiness())["index"].ok
            seen.append((runner.index_ok, len(sink.decisions), len(source.committed), ready))
            await asyncio.sleep(0.02)
        await task

    asyncio.run(go())
    down = [s for s in seen if not s[0]]
    assert down and all(s == (False, 0, 0, False) for s in down)
    assert runner.index_ok and api.index_problem() == ""
    assert [outcome(d) for d in sink.decisions] == [outcome(d) for d in expected.decisions]
    assert source.committed == {S0: 4, S1: 4}
    text = metrics.exposition()[0].decode()
    assert 'stream_dedup_index_errors_total{operation="decide"} 4.0' in text
    assert sum("the index is unavailable" in r.message for r in caplog.records) == 1


def test_a_stop_while_the_index_is_unavailable_abandons_the_batch_uncommitted() -> None:
    settings = Settings(batch_size=100)
    dedup = Deduplicator(settings, FlakyIndex(settings, failures=10**9))  # type: ignore[arg-type]
    source, sink = ListSource(page_streams(3)), ListSink()
    runner = Runner(settings, dedup, source, sink)

    async def go() -> float:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        started = time.monotonic()
        await runner.run(stop)
        return time.monotonic() - started

    took: list[float] = []  # in a thread: a runner that never stops fails the test, not hangs it
    threading.Thread(target=lambda: took.append(asyncio.run(go())), daemon=True).start()
    for _ in range(100):
        if took:
            break
        time.sleep(0.1)
    assert took and took[0] < 2.0
    assert sink.decisions == [] and source.committed == {}
    assert runner.stats.abandoned == 6 and not runner.index_ok


@pytest.mark.redis
def test_a_redis_index_that_goes_down_holds_the_batch_until_it_is_back(tmp_path: Path) -> None:
    """A real Redis (deploy/redis-local, one node) stops under the runner: the batch waits,
    nothing of it out or committed, the runner not ready; Redis starts again (empty, as a
    node without persistence comes back) and the batch goes through, decided as a memory
    index decides it."""
    script = str(Path(__file__).resolve().parents[1] / "deploy" / "redis-local")
    env = {**os.environ, "REDIS_LOCAL_PORT": str(free_redis_ports(1))}

    def redis(*args: str) -> str:
        out = subprocess.run([script, *args, str(tmp_path / "redis")], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip()

    streams = page_streams(4)
    expected = ListSink()
    memory = Settings(batch_size=100)
    asyncio.run(run_list(memory, ListSource(streams), expected, Deduplicator(memory)))
    url = redis("start", "--single").splitlines()[-1]
    try:
        settings = Settings(index="redis", redis_url=url, batch_size=100)
        dedup = Deduplicator(settings)
        redis("stop")
        source, sink = ListSource(streams), ListSink()
        runner = Runner(settings, dedup, source, sink)

        async def go() -> tuple[int, dict[str, int]]:
            task = asyncio.create_task(runner.run(asyncio.Event()))
            for _ in range(600):
                if not runner.index_ok or task.done():
                    break
                await asyncio.sleep(0.05)
            assert not runner.index_ok, "the runner never saw the index down"
            await asyncio.sleep(1.0)  # a few retries
            held = len(sink.decisions), dict(source.committed)
            await asyncio.to_thread(redis, "start", "--single")
            await asyncio.wait_for(task, 60)
            return held

        assert asyncio.run(go()) == (0, {})
        dedup.close()
    finally:
        redis("stop")
    assert runner.index_ok and source.committed == {S0: 4, S1: 4}
    assert [(d.decision, d.reason) for d in sink.decisions] == [
        (d.decision, d.reason) for d in expected.decisions]
