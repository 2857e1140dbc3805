"""The delivery contract: batch -> decide -> send -> flush -> commit. At-least-once.

For every batch of consumed records, in this order:
  1. fetch up to `batch_size` records (getmany); keep only partitions still assigned;
  2. turn each record into a Page or a Rejected (bad input is a value, not an exception);
  3. decide the batch in input order, per partition, in a worker thread (the pure stages
     fan out to a process pool), so the event loop keeps serving fetches and heartbeats;
  4. send one decision per record (decisions topic, key = URL), the original record to
     the kept topic for `keep` decisions, and the original bytes plus the error to the
     dead-letter topic for `reject` decisions;
  5. wait until the broker has acknowledged every one of those sends;
  6. only then commit, per partition, the offset after the batch's last record.
A crash anywhere before 6 means the batch is consumed again: outputs may repeat, nothing is
lost. A send that fails is retried with backoff (the batch is not committed until it goes
through). A rebalance waits for the batch in flight (steps 3-6 hold a lock that the revoke
callback takes), so partitions are handed over committed.

Metrics (metrics.py): consumer lag per partition after every poll, commit latency, failed
Kafka operations, dead letters, and page -> decision latency once a batch's outputs are
acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError, KafkaError

from .config import Settings
from .metrics import Metrics
from .models import Decision, Page, Rejected
from .pipeline import Deduplicator
from .sources.kafka import page_from_message, source_of

log = logging.getLogger("stream_dedup.runner")

MAX_BACKOFF_S = 30.0
EXPIRY_EVERY_S = 60.0
POSITION_TIMEOUT_S = 0.5  # a partition without a fetch position yet is skipped for lag


@dataclass
class RunStats:
    batches: int = 0
    records: int = 0
    committed: int = 0
    send_retries: int = 0
    decisions: dict[str, int] = field(default_factory=dict)


async def retry(what: str, attempt: Callable[[], Awaitable[Any]], stop: asyncio.Event,
                failed: Callable[[KafkaError], None] | None = None) -> Any:
    """Run `attempt` until it succeeds, with exponential backoff, logging (and telling
    `failed` about) every failure. Gives up only when `stop` is set (re-raising the error)."""
    delay = 0.5
    while True:
        try:
            return await attempt()
        except KafkaError as exc:
            if failed is not None:
                failed(exc)
            if stop.is_set():
                raise
            log.warning("%s failed (%s: %s); retrying in %.1f s", what, type(exc).__name__,
                        exc, delay)
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, MAX_BACKOFF_S)


class _FinishBeforeRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, lock: asyncio.Lock, metrics: Metrics, runner: Runner) -> None:
        self._lock = lock
        self._metrics = metrics
        self._runner = runner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:  # the batch in flight is sent and committed first
            log.info("partitions revoked: %s", _names(revoked))
            self._metrics.forget_partitions((tp.topic, tp.partition) for tp in revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("partitions assigned: %s", _names(assigned))
        # Resume where the index says it is: a persistent index stores the offsets of the
        # pages it holds atomically with them, and may be ahead of the group's commit.
        stored = self._runner.dedup.index.offsets()
        for tp in assigned:
            offset = stored.get(f"{tp.topic}/{tp.partition}")
            if offset is not None:
                self._runner.consumer.seek(tp, offset)
                log.info("%s/%d: resuming at offset %d, as stored in the index",
                         tp.topic, tp.partition, offset)


def _names(partitions: list[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in partitions)


class Runner:
    def __init__(
        self,
        settings: Settings,
        dedup: Deduplicator,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        pool: Executor | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.dedup = dedup
        self.consumer = consumer
        self.producer = producer
        self.pool = pool
        self.metrics = metrics or Metrics(settings, process=False)
        self.stats = RunStats()
        self.lock = asyncio.Lock()
        self.listener = _FinishBeforeRevoke(self.lock, self.metrics, self)
        self._next_expiry = 0.0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="decide")
        self.last_progress = time.monotonic()

    async def run(self, stop: asyncio.Event) -> None:
        """Process batches until `stop` is set; the batch in flight is always finished."""
        try:
            while not stop.is_set():
                fetched = await self.consumer.getmany(
                    timeout_ms=500, max_records=self.settings.batch_size
                )
                received = time.time()
                if fetched:
                    async with self.lock:
                        await self.process(fetched, stop, received)
                else:  # idle: the index gauges may lag behind the last batch
                    await asyncio.get_running_loop().run_in_executor(
                        self._thread, self.metrics.refresh_index, self.dedup)
                await self._observe_lag()
                await self._expire()
        finally:
            self._thread.shutdown(wait=True)

    async def process(
        self, fetched: dict[TopicPartition, list[ConsumerRecord]], stop: asyncio.Event,
        received: float | None = None,
    ) -> None:
        owned = self.consumer.assignment()
        batch = [(tp, rec) for tp, recs in fetched.items() if tp in owned for rec in recs]
        abandoned = sum(len(recs) for tp, recs in fetched.items() if tp not in owned)
        if abandoned:
            log.info("abandoned %d records of revoked partitions (not committed)", abandoned)
        if not batch:
            return
        loop = asyncio.get_running_loop()
        items, decisions = await loop.run_in_executor(self._thread, self._decide, batch)
        m = self.metrics
        await retry("sending a batch's outputs", lambda: self._send(batch, items, decisions),
                    stop, lambda _: m.kafka_error("produce"))
        sent = time.time()
        m.dead_letters.inc(sum(d.decision == "reject" for d in decisions))
        if self.stats.batches + 1 == self.settings.fault_exit_before_commit:
            log.error("fault injection: exiting before committing batch %d", self.stats.batches + 1)
            os._exit(70)
        offsets: dict[TopicPartition, int] = {}
        for tp, rec in batch:
            offsets[tp] = max(offsets.get(tp, 0), rec.offset + 1)
        # The index (its pages and these offsets, atomically) before the group's commit:
        # after a crash between the two, the service resumes from the index's offsets.
        await loop.run_in_executor(self._thread, self.dedup.commit,
                                   {f"{tp.topic}/{tp.partition}": o for tp, o in offsets.items()})
        started = time.perf_counter()
        await retry("committing offsets", lambda: self.consumer.commit(offsets), stop,
                    lambda _: m.kafka_error("commit"))
        m.commit_seconds.observe(time.perf_counter() - started)
        m.decided(items, sent if received is None else received, sent)
        m.progress()
        self.stats.batches += 1
        self.stats.records += len(batch)
        self.stats.committed += len(batch)
        for d in decisions:
            key = f"{d.decision}/{d.reason}"
            self.stats.decisions[key] = self.stats.decisions.get(key, 0) + 1
        self.last_progress = time.monotonic()

    async def _expire(self) -> None:
        """The retention window, applied while running: a bounded sweep once a minute."""
        days = self.settings.retention_days
        if days <= 0 or time.monotonic() < self._next_expiry:
            return
        self._next_expiry = time.monotonic() + EXPIRY_EVERY_S
        cutoff = datetime.now(UTC) - timedelta(days=days)
        removed = await asyncio.get_running_loop().run_in_executor(
            self._thread, self.dedup.expire, cutoff)
        if removed:
            log.info("retention: forgot %d pages crawled before %s", removed, cutoff.isoformat())

    async def _observe_lag(self) -> None:
        """Lag = highwater - position for every assigned partition the fetcher has seen."""
        for tp in self.consumer.assignment():
            if tp not in self.consumer.assignment():  # revoked while we awaited
                continue
            highwater = self.consumer.highwater(tp)
            if highwater is None:
                continue
            try:
                position = await asyncio.wait_for(self.consumer.position(tp), POSITION_TIMEOUT_S)
            except (TimeoutError, IllegalStateError):
                continue
            if tp in self.consumer.assignment():  # a revoke meanwhile forgot its lag
                self.metrics.consumer_lag(tp.topic, tp.partition, max(0, highwater - position))

    def _decide(
        self, batch: list[tuple[TopicPartition, ConsumerRecord]]
    ) -> tuple[list[Page | Rejected], list[Decision]]:
        """Records -> pages -> decisions, in the decide thread: JSON and base64 decoding
        (about a tenth of the work) stay off the event loop too."""
        items = [self._item(rec) for _, rec in batch]
        return items, self.dedup.check_batch(items, self.pool)

    def _item(self, rec: ConsumerRecord) -> Page | Rejected:
        return page_from_message(
            rec.value, rec.key, list(rec.headers or ()),
            source_of(rec.topic, rec.partition, rec.offset),
            input_format=self.settings.input_format, max_bytes=self.settings.max_page_bytes,
        )

    async def _send(
        self,
        batch: list[tuple[TopicPartition, ConsumerRecord]],
        items: list[Page | Rejected],
        decisions: list[Decision],
    ) -> None:
        s = self.settings
        acks: list[asyncio.Future[Any]] = []
        for (_, rec), item, d in zip(batch, items, decisions, strict=True):
            key = (d.url or "").encode("utf-8") or rec.key
            acks.append(await self.producer.send(s.decisions_topic, d.to_json().encode(), key=key))
            if d.decision == "keep" and s.kept_topic:
                acks.append(await self.producer.send(
                    s.kept_topic, rec.value, key=rec.key, headers=list(rec.headers or ())))
            elif d.decision == "reject":
                assert isinstance(item, Rejected)
                acks.append(await self.producer.send(
                    s.dead_letter_topic, (rec.value or b"")[:DEAD_LETTER_MAX], key=rec.key,
                    headers=[*(rec.headers or ()), *_error_headers(item)]))
        await asyncio.gather(*acks)


DEAD_LETTER_MAX = 900_000  # stays under the broker's default message.max.bytes (~1 MB)


def _error_headers(item: Rejected) -> list[tuple[str, bytes]]:
    headers = [
        ("stream-dedup-error", item.kind.encode()),
        ("stream-dedup-message", item.message.encode("utf-8", "replace")[:4096]),
        ("stream-dedup-source", (item.source or "").encode()),
    ]
    if item.raw is not None and len(item.raw) > DEAD_LETTER_MAX:
        headers.append(("stream-dedup-truncated", str(len(item.raw)).encode()))
    return headers
