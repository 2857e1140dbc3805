"""The pump that takes records from the consumer while a batch is decided (kafka/pump.py):
in order, bounded, dropped by partition, errors raised to the taker; and against a real
broker, the records that arrive while the taker is busy are all in its next batch."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError

from stream_dedup.kafka.pump import Pump

A, B = TopicPartition("in", 0), TopicPartition("in", 1)


class Consumer:
    """getmany from a queue of answers (each a dict or an exception), then nothing."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[Any] = asyncio.Queue()
        self.calls: list[int] = []

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[int]]:
        self.calls.append(max_records)
        try:
            answer = await asyncio.wait_for(self.answers.get(), timeout_ms / 1000)
        except TimeoutError:
            return {}
        if isinstance(answer, BaseException):
            raise answer
        return answer


def test_records_taken_while_busy_come_in_order_up_to_the_limit() -> None:
    async def go() -> None:
        consumer = Consumer()
        pump = Pump(consumer, limit=5)  # type: ignore[arg-type]
        assert await pump.take(10, 0.05) == {}
        for answer in ({A: [1, 2]}, {B: [10]}, {A: [3, 4]}):
            consumer.answers.put_nowait(answer)
        await asyncio.sleep(0.05)  # the taker is busy; the pump is not
        assert pump.count == 5 and pump.pending(A) == 4
        calls = len(consumer.calls)
        consumer.answers.put_nowait({A: [5]})
        await asyncio.sleep(0.05)
        assert len(consumer.calls) == calls  # full: no getmany until records are taken
        assert await pump.take(3, 0.05) == {A: [1, 2, 3]}
        await asyncio.sleep(0.05)
        assert consumer.calls[calls] == 3  # asks for no more than there is room for
        assert pump.taken() == {A: [4, 5], B: [10]}
        pump.close()

    asyncio.run(go())


def test_drop_forgets_partitions_and_errors_reach_the_taker() -> None:
    async def go() -> None:
        consumer = Consumer()
        pump = Pump(consumer, limit=100)  # type: ignore[arg-type]
        consumer.answers.put_nowait({A: [1], B: [2, 3]})
        assert await pump.take(100, 1.0) == {A: [1], B: [2, 3]}
        consumer.answers.put_nowait({A: [4], B: [5]})
        await asyncio.sleep(0.05)
        assert pump.drop([B]) == 1
        assert pump.pending(B) == 0 and pump.pending(A) == 1
        assert pump.drop(None) == 1 and pump.count == 0
        consumer.answers.put_nowait(KafkaConnectionError("broker gone"))
        with pytest.raises(KafkaConnectionError):
            await pump.take(100, 1.0)
        consumer.answers.put_nowait({A: [6]})  # the next take starts the pump again
        assert await pump.take(100, 1.0) == {A: [6]}
        pump.close()

    asyncio.run(go())


def test_the_next_batch_is_what_arrived_while_the_last_was_decided(kafka_bootstrap: str) -> None:
    """aiokafka alone fetches a partition again only once its records are taken: of 30
    records sent while the taker is busy, its next take has the one or two of the fetch
    sent at the last take. The pump's has them all."""

    async def go() -> None:
        topic = f"pump-{uuid.uuid4().hex[:8]}"
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=0)
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=topic,
                                    auto_offset_reset="earliest")
        await producer.start()
        await consumer.start()
        pump = Pump(consumer, limit=500)
        try:
            await producer.send_and_wait(topic, b"first")
            first: dict[Any, list[Any]] = {}
            while not first:
                first = await pump.take(500, 5.0)
            for i in range(30):  # the taker is busy deciding meanwhile
                await producer.send_and_wait(topic, b"%d" % i)
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            batch = await pump.take(500, 5.0)
            assert sum(map(len, batch.values())) == 30
        finally:
            pump.close()
            await consumer.stop()
            await producer.stop()

    asyncio.run(go())
