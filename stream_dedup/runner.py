"""The delivery contract: batch -> decide -> send -> flush -> commit. At-least-once.

For every batch of consumed records, in this order:
  1. fetch up to `batch_size` records (getmany); keep only partitions still assigned;
  2. turn each record into a Page or a Rejected (bad input is a value, not an exception);
  3. write the batch's plan to the index (a persistent one keeps it until the commit, so a
     restart decides that batch again exactly as cut: `adopt_plan`); decide the batch in
     input order, per partition, in a worker thread (the pure stages fan out to a process
     pool), so the event loop keeps serving fetches and heartbeats;
  4. send one decision per record (decisions topic, key = URL), the original record to
     the kept topic for `keep` decisions, and the original bytes plus the error to the
     dead-letter topic for `reject` decisions;
  5. wait until the broker has acknowledged every one of those sends;
  6. only then commit, per partition, the offset after the batch's last record.
A crash anywhere before 6 means the batch is consumed again: outputs may repeat, nothing is
lost. A rebalance waits for the batch in flight (steps 3-6 hold a lock that the revoke
callback takes), so partitions are handed over committed.

Errors, by aiokafka's `retriable` flag (timeouts and lost connections count as retriable):
- a retriable one is retried with backoff; a send resends only the messages that were not
  acknowledged, so a long outage does not multiply the outputs;
- a message larger than its topic accepts is never sent: sinks/kafka.py reduces it first,
  against the limits read at start (and to its floor if the broker still refuses it);
- any other error stops the service with a KafkaDeliveryError that names it; a commit
  refused because the group rebalanced is not an error (the new owner gets the records);
- a record that cannot become a page is a reject (sources/kafka.py never raises), and a
  page whose deciding raises an unexpected error becomes an `internal-error` reject: one
  record never stops the stream.
Stop (SIGTERM/SIGINT/SIGHUP) finishes the batch in flight if the broker takes it within
STOP_GRACE_S, else abandons it uncommitted (it is delivered again), so a stop never waits on
a broker that is down.

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
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    KafkaError,
    MessageSizeTooLargeError,
    RebalanceInProgressError,
    RecordTooLargeError,
    UnknownMemberIdError,
)

from .config import Settings
from .errors import KafkaDeliveryError, StreamDedupError
from .kafka_client import (
    MAX_BACKOFF_S,
    STOP_GRACE_S,
    Abandoned,
    Limits,
    is_retriable,
    pause,
    retry,
    stop_within,
    within_grace,
)
from .metrics import Metrics
from .models import Decision, Page, Rejected, position_id
from .pipeline import Deduplicator
from .sinks.kafka import Message, Topics, as_record, messages_for
from .sources.kafka import page_from_message, source_of

log = logging.getLogger("stream_dedup.runner")

EXPIRY_EVERY_S = 60.0
POSITION_TIMEOUT_S = 0.5  # a partition without a fetch position yet is skipped for lag
REFORM_TIMEOUT_S = 120.0  # how long a restart waits for the records of the batch in flight
# A commit refused because the group moved on: the records go to their new owner.
REBALANCED = (CommitFailedError, IllegalStateError, RebalanceInProgressError,
              UnknownMemberIdError, IllegalGenerationError)
TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)


@dataclass
class RunStats:
    batches: int = 0
    records: int = 0
    committed: int = 0
    send_retries: int = 0
    abandoned: int = 0
    decisions: dict[str, int] = field(default_factory=dict)


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
        self._runner.adopt_plan(assigned)
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


def _split(source: str) -> tuple[str, int]:
    topic, partition = source.rsplit("/", 1)
    return topic, int(partition)


def plan_of(batch: list[tuple[TopicPartition, ConsumerRecord]]) -> list[tuple[str, int, int]]:
    """A batch's composition: each partition's offset range, in the order decided."""
    ranges: dict[TopicPartition, list[int]] = {}
    for tp, rec in batch:
        span = ranges.setdefault(tp, [rec.offset, rec.offset + 1])
        span[0], span[1] = min(span[0], rec.offset), max(span[1], rec.offset + 1)
    return [(f"{tp.topic}/{tp.partition}", first, end) for tp, (first, end) in ranges.items()]


class Runner:
    def __init__(
        self,
        settings: Settings,
        dedup: Deduplicator,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer | None,  # None until the service has made it (new_producer)
        pool: Executor | None = None,
        metrics: Metrics | None = None,
        limits: Limits | None = None,
        new_producer: Callable[[], Awaitable[AIOKafkaProducer]] | None = None,
        new_pool: Callable[[], Executor] | None = None,
    ) -> None:
        self.settings = settings
        self.dedup = dedup
        self.consumer = consumer
        self.producer = producer
        self.pool = pool
        self.metrics = metrics or Metrics(settings, process=False)
        self.limits = limits or Limits()
        # A producer that hit a non-retriable error (its idempotent sequence numbers may no
        # longer match the broker's) is replaced by a new one before anything is resent.
        self.new_producer = new_producer
        self.new_pool = new_pool  # a worker died (OOM killer...): new workers for the next
        self.topics = Topics(settings.decisions_topic, settings.kept_topic,
                             settings.dead_letter_topic)
        self.stats = RunStats()
        self.lock = asyncio.Lock()
        self.listener = _FinishBeforeRevoke(self.lock, self.metrics, self)
        self._next_expiry = 0.0
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="decide")
        self.last_progress = time.monotonic()
        # Re-forming the batch that was in flight when a persistent index last stopped:
        # its plan, the records held until the plan's ranges are all fetched, and the
        # records fetched beyond them (the next batch).
        self._plan: list[tuple[TopicPartition, int, int]] | None = None
        self._plan_deadline = 0.0
        self._held: dict[TopicPartition, list[ConsumerRecord]] = {}
        self._carry: dict[TopicPartition, list[ConsumerRecord]] = {}

    def adopt_plan(self, assigned: list[TopicPartition]) -> None:
        """After an assignment: decide the batch a crash left in flight exactly as it was
        first decided (same records, same order), if this consumer owns all its partitions;
        a redelivered batch cut differently could decide a near-duplicate pair spread over
        two partitions the other way round."""
        self._held, self._carry, self._plan = {}, {}, None
        plan = self.dedup.index.inflight()
        if not plan:
            return
        steps = [(TopicPartition(*_split(source)), first, end) for source, first, end in plan]
        missing = sorted({f"{tp.topic}/{tp.partition}" for tp, _, _ in steps} -
                         {f"{tp.topic}/{tp.partition}" for tp in assigned})
        if missing:
            log.warning("the batch in flight at the last stop also covered %s, now assigned "
                        "elsewhere: its records are decided as they come", ", ".join(missing))
            return
        self._plan, self._plan_deadline = steps, time.monotonic() + REFORM_TIMEOUT_S
        log.info("deciding the batch in flight at the last stop again, as it was: %s",
                 ", ".join(f"{tp.topic}/{tp.partition}@{f}..{e - 1}" for tp, f, e in steps))

    async def _next_batch(self) -> dict[TopicPartition, list[ConsumerRecord]]:
        if self._carry:
            fetched, self._carry = self._carry, {}
            return fetched
        fetched = await self.consumer.getmany(timeout_ms=500, max_records=self.settings.batch_size)
        if self._plan is None:
            return fetched
        for tp, records in fetched.items():
            self._held.setdefault(tp, []).extend(records)
        for tp, _, end in self._plan:
            if tp not in self.consumer.assignment():
                self._plan = None  # revoked meanwhile: adopt_plan runs again on assignment
                return {}
            if await self.consumer.position(tp) < end and time.monotonic() < self._plan_deadline:
                return {}  # not all fetched yet
        ranges = {tp: (first, end) for tp, first, end in self._plan}
        batch = {tp: [r for r in self._held.get(tp, ()) if first <= r.offset < end]
                 for tp, (first, end) in ranges.items()}
        for tp, records in self._held.items():
            first, end = ranges.get(tp, (0, 0))
            rest = [r for r in records if not first <= r.offset < end]
            if rest:
                self._carry[tp] = rest
        self._plan, self._held = None, {}
        return batch

    async def run(self, stop: asyncio.Event) -> None:
        """Process batches until `stop` is set; the batch in flight is always finished."""
        fetch_delay = 0.5
        try:
            while not stop.is_set():
                try:
                    fetched = await self._next_batch()
                except KafkaError as exc:
                    self.metrics.kafka_error("fetch")
                    if not is_retriable(exc):
                        raise KafkaDeliveryError(f"fetching records: {type(exc).__name__}: "
                                                 f"{exc}") from exc
                    log.warning("fetching records failed (%s: %s); retrying in %.1f s",
                                type(exc).__name__, exc, fetch_delay)
                    await pause(stop, fetch_delay)
                    fetch_delay = min(fetch_delay * 2, MAX_BACKOFF_S)
                    continue
                fetch_delay = 0.5
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
        messages: list[Message] = []
        for (_, rec), item, d in zip(batch, items, decisions, strict=True):
            for_record, reduced = messages_for(as_record(rec), item, d, self.topics,
                                               self.limits.of)
            messages += for_record
            for output in reduced:
                m.reduced.labels(output).inc()
                log.warning("%s: the %s for this record is larger than its topic accepts; "
                            "sent reduced", item.source, output)
        try:
            await within_grace(self._deliver(messages, stop), stop)
            sent = time.time()
            m.dead_letters.inc(sum(d.decision == "reject" for d in decisions))
            if self.stats.batches + 1 == self.settings.fault_exit_before_commit:
                log.error("fault injection: exiting before committing batch %d",
                          self.stats.batches + 1)
                os._exit(70)
            offsets: dict[TopicPartition, int] = {}
            for tp, rec in batch:
                offsets[tp] = max(offsets.get(tp, 0), rec.offset + 1)
            # The index (its pages and these offsets, atomically) before the group's commit:
            # after a crash between the two, the service resumes from the index's offsets.
            await loop.run_in_executor(
                self._thread, self.dedup.commit,
                {f"{tp.topic}/{tp.partition}": o for tp, o in offsets.items()})
            started = time.perf_counter()
            await within_grace(self._commit(offsets, stop), stop)
        except Abandoned:
            log.warning("stopping: the broker did not take a batch of %d records within %.0f s"
                        " of the stop; it is not committed and will be delivered again",
                        len(batch), STOP_GRACE_S)
            self.stats.abandoned += len(batch)
            return
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

    async def _commit(self, offsets: dict[TopicPartition, int], stop: asyncio.Event) -> None:
        try:
            await retry("committing offsets", lambda: self.consumer.commit(offsets), stop,
                        lambda _: self.metrics.kafka_error("commit"))
        except REBALANCED as exc:
            log.warning("commit refused (%s): the group rebalanced; the new owner of these "
                        "partitions gets their records again", type(exc).__name__)
        except KafkaError as exc:
            raise KafkaDeliveryError(f"committing offsets: {type(exc).__name__}: {exc}") from exc

    async def _deliver(self, messages: list[Message], stop: asyncio.Event) -> None:
        """Send every message until the broker acknowledged each: only the ones that failed
        are sent again, after a backoff; one still too large is cut to its minimum."""
        pending, delay = messages, 0.5
        while pending:
            failed = await self._attempt(pending)
            if not failed:
                return
            self.metrics.kafka_error("produce")
            again: list[Message] = []
            renew = False
            for msg, exc in failed:
                if isinstance(exc, TOO_LARGE):  # a limit lowered since start
                    smallest = msg.floor()
                    if smallest is None:
                        raise KafkaDeliveryError(
                            f"{msg.topic} refuses a {msg.output} message of {msg.size()} "
                            "bytes, the smallest it can be: raise the topic's "
                            "max.message.bytes") from exc
                    again.append(smallest)
                    self.metrics.reduced.labels(msg.output).inc()
                    renew = True
                elif is_retriable(exc):
                    again.append(msg)
                else:
                    raise KafkaDeliveryError(f"sending to {msg.topic}: {type(exc).__name__}: "
                                             f"{exc}") from exc
            if renew and self.new_producer is not None:
                old, self.producer = self.producer, await self.new_producer()
                await stop_within(old, STOP_GRACE_S)
            if stop.is_set():
                raise Abandoned("sending")
            exc = failed[0][1]
            log.warning("%d of %d messages not acknowledged (%s: %s); sending them again in "
                        "%.1f s", len(failed), len(pending), type(exc).__name__, exc, delay)
            self.stats.send_retries += 1
            await pause(stop, delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
            pending = again

    async def _attempt(self, messages: list[Message]) -> list[tuple[Message, BaseException]]:
        """Send once; the messages that failed, with why. After one send that could not even
        be queued (the broker's metadata is unreachable) the rest are not tried."""
        queued: list[tuple[Message, asyncio.Future[Any]]] = []
        failed: list[tuple[Message, BaseException]] = []
        assert self.producer is not None, "the service makes the producer before run()"
        for i, msg in enumerate(messages):
            try:
                ack = await self.producer.send(msg.topic, msg.value, key=msg.key,
                                               headers=list(msg.headers))
            except KafkaError as exc:
                failed += [(later, exc) for later in messages[i:]]
                break
            queued.append((msg, ack))
        results = await asyncio.gather(*(ack for _, ack in queued), return_exceptions=True)
        failed += [(msg, r) for (msg, _), r in zip(queued, results, strict=True)
                   if isinstance(r, BaseException)]
        return failed

    def _decide(
        self, batch: list[tuple[TopicPartition, ConsumerRecord]]
    ) -> tuple[list[Page | Rejected], list[Decision]]:
        """Records -> pages -> decisions, in the decide thread: JSON and base64 decoding
        (about a tenth of the work) stay off the event loop too."""
        items = [self._item(rec) for _, rec in batch]
        self.dedup.begin(plan_of(batch))
        try:
            return items, self.dedup.check_batch(items, self.pool)
        except StreamDedupError:
            raise  # the index cannot be written: stop (nothing more is committed)
        except BrokenProcessPool:
            log.error("a worker process died while analysing a batch of %d; starting new "
                      "workers, and deciding this batch in this process", len(items))
            broken, self.pool = self.pool, self.new_pool() if self.new_pool else None
            if broken is not None:
                broken.shutdown(wait=False, cancel_futures=True)
        except Exception:
            log.exception("deciding a batch of %d raised; deciding its pages one at a time",
                          len(items))
        decisions = []
        for i, item in enumerate(items):
            try:
                decisions.append(self.dedup.reject(item) if isinstance(item, Rejected)
                                 else self.dedup.check(item))
            except StreamDedupError:
                raise
            except Exception as exc:
                log.exception("%s: deciding this page raised; it goes to the dead-letter "
                              "topic", item.source)
                items[i] = Rejected(item.url, "internal-error",
                                    f"deciding raised {type(exc).__name__}: {exc}"[:1000],
                                    item.source, getattr(item, "body", None))
                decisions.append(self.dedup.reject(items[i]))
        return items, decisions

    def _item(self, rec: ConsumerRecord) -> Page | Rejected:
        return page_from_message(
            rec.value, rec.key, list(rec.headers or ()),
            source_of(rec.topic, rec.partition, rec.offset),
            input_format=self.settings.input_format, max_bytes=self.settings.max_page_bytes,
            position=position_id(rec.timestamp, rec.partition, rec.offset),
        )

