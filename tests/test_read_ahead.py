"""At-least-once, KafkaSource reads ahead while a batch is delivered and committed
(KafkaSource.decided; exactly-once does not): the next batch holds every record that arrived
while this one was decided, and a revoke drops what was read ahead of its partitions."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from test_runner import P0, P1, FakeConsumer, near_pairs

from stream_dedup import Deduplicator, Settings
from stream_dedup.kafka.edges import KafkaSource
from stream_dedup.metrics import Metrics


def test_the_next_batch_holds_what_arrived_while_this_one_was_decided(
        kafka_bootstrap: str) -> None:
    """Two sends arrive while a batch is decided. aiokafka fetches the first and then waits
    for it to be taken; read ahead, the next batch holds both (not read ahead: the next
    batch holds what its first fetch caught, no more than the first send)."""

    async def batches(read_ahead: bool) -> list[list[int]]:
        topic = f"ahead-{uuid.uuid4().hex[:8]}"
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=topic,
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await producer.start()
        await consumer.start()
        try:
            async def send(first: int) -> None:
                for i in range(first, first + 5):
                    await producer.send_and_wait(topic, str(i).encode(), partition=0)

            await send(0)
            consumer.assign([TopicPartition(topic, 0)])
            settings = Settings(bootstrap_servers=kafka_bootstrap, batch_size=100)
            source = KafkaSource(settings, consumer, Deduplicator(settings).index,
                                 Metrics(settings, process=False))
            stop, got = asyncio.Event(), []
            batch = await source.fetch(100, stop)
            async with source.hold(batch) as held:
                got.append([r.offset for r in held.records])
                await send(5)
                await asyncio.sleep(0.5)  # fetched, and left in the fetcher's buffer
                await send(10)
                await asyncio.sleep(0.5)
                if read_ahead:
                    await source.decided()
                    await asyncio.sleep(0.5)
            got.append([r.offset for r in (await source.fetch(100, stop)).records])
            return got
        finally:
            await consumer.stop()
            await producer.stop()

    assert asyncio.run(batches(True)) == [list(range(5)), list(range(5, 15))]
    first, second = asyncio.run(batches(False))
    assert first == list(range(5)) and second == list(range(5, 5 + len(second)))
    assert len(second) <= 5


def test_a_revoke_drops_what_was_read_ahead_of_its_partitions() -> None:
    """Read ahead under a batch's hold, then a revoke of one partition: its records are not
    handed out (its next owner gets them), the other's are, after the ones already taken."""

    async def go() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        settings = Settings(batch_size=4)
        stop = asyncio.Event()
        consumer = FakeConsumer(near_pairs(6), [P0, P1], stop)
        source = KafkaSource(settings, consumer, Deduplicator(settings).index,  # type: ignore[arg-type]
                             Metrics(settings, process=False))
        batch = await source.fetch(4, stop)
        first = [(r.partition, r.offset) for r in batch.records]
        async with source.hold(batch):
            await source.decided()
        await source.listener.on_partitions_revoked([P0])
        nxt = await source.fetch(4, stop)
        return first, [(r.partition, r.offset) for r in nxt.records]

    first, nxt = asyncio.run(go())
    assert first == [(0, 0), (0, 1), (0, 2), (0, 3)]
    # read ahead: P0 4-5 and P1 0-1 (a batch of 4); P0's dropped
    assert nxt[:2] == [(1, 0), (1, 1)] and all(p == 1 for p, _ in nxt)
