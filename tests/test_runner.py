"""The runner's Kafka edges over in-process stand-ins for aiokafka's clients (a scripted
consumer and producer); the rest is the real one: KafkaSource, KafkaSink, Runner,
Deduplicator, the LSM index on disk."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    KafkaConnectionError,
    MessageSizeTooLargeError,
    TopicAuthorizationFailedError,
)
from aiokafka.structs import ConsumerRecord
from opskit import _WORDS, html

from stream_dedup import Deduplicator, Settings
from stream_dedup.edges import Crash, Faults
from stream_dedup.errors import KafkaDeliveryError
from stream_dedup.kafka_edges import KafkaSink, KafkaSource
from stream_dedup.metrics import Metrics
from stream_dedup.runner import Runner


class FakeConsumer:
    """Partitions of records; getmany drains them in `order`, as a fetch might."""

    def __init__(self, records: dict[TopicPartition, list[ConsumerRecord]],
                 order: list[TopicPartition], stop: asyncio.Event) -> None:
        self.records, self.order, self.stop = records, order, stop
        self.pos = dict.fromkeys(records, 0)
        self.committed: dict[TopicPartition, int] = {}

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
            self.stop.set()
        return out

    async def position(self, tp: TopicPartition) -> int:
        return self.pos[tp]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.pos[tp] = offset

    def highwater(self, tp: TopicPartition) -> int:
        return len(self.records[tp])

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.committed.update(offsets)


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


def near_pairs(n: int) -> dict[TopicPartition, list[ConsumerRecord]]:
    """Article i on partition 0 and a copy with two words changed on partition 1."""
    import random
    rng = random.Random(5)
    out: dict[TopicPartition, list[ConsumerRecord]] = {P0: [], P1: []}
    for i in range(n):
        words = [rng.choice(_WORDS) for _ in range(400)]
        edited = list(words)
        for j in rng.sample(range(len(words)), 2):
            edited[j] = "zq" + edited[j]
        for tp, text in ((P0, words), (P1, edited)):
            page = {"url": f"https://p.example/{i}/{tp.partition}", "html": html([" ".join(text)])}
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
    producer = FakeProducer([MessageSizeTooLargeError()] * 2)  # no kept topic: both hit it
    with pytest.raises(KafkaDeliveryError, match="max.message.bytes"):
        asyncio.run(run(Settings(batch_size=100), records, [P0], producer))


def test_a_non_retriable_error_stops_with_its_name() -> None:
    settings = Settings(batch_size=100)
    producer = FakeProducer([TopicAuthorizationFailedError()])
    with pytest.raises(KafkaDeliveryError, match="TopicAuthorizationFailed"):
        asyncio.run(run(settings, near_pairs(1), [P0, P1], producer))

