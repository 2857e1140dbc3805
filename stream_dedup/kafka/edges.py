"""The runner's Kafka edges: KafkaSource over an AIOKafkaConsumer, KafkaSink over an
AIOKafkaProducer (clients made by kafka/client.py).

KafkaSource
- fetches with `getmany` (retriable errors retried with backoff, others stop the service),
  observes consumer lag per partition after every fetch;
- holds a batch under a lock that the rebalance listener takes too: a revoke waits until the
  batch in flight is committed, and records of partitions revoked meanwhile are dropped
  uncommitted (their new owner gets them);
- on every assignment resumes each partition at the offset stored in the index (a
  persistent index stores them with its pages, and may be ahead of the group's commit), and
  re-forms the batch a crash left in flight from the index's plan: it fetches until it holds
  exactly those records and hands them over in that order before anything else;
- commits offsets per partition; a commit refused because the group rebalanced is logged,
  not an error.
KafkaSink
- sends one decision per record (key = URL), the original to the kept topic for keeps, the
  original bytes and the error to the dead-letter topic for rejects, each within the size its
  topic accepts (kafka/decisions.py), as whole record batches handed to the producer's
  sender at once (kafka_client.send_batched), and waits for every acknowledgement;
- sends again only what failed with a retriable error, with backoff; a message refused as
  too large goes again at its floor, and the ones after it in its partition (refused as out
  of sequence) as they were, from a new producer; anything else stops the service
  with a KafkaDeliveryError that names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import (
    CommitFailedError,
    IllegalGenerationError,
    IllegalStateError,
    KafkaError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    RebalanceInProgressError,
    RecordTooLargeError,
    UnknownMemberIdError,
)

from stream_dedup.config import Settings
from stream_dedup.errors import KafkaDeliveryError
from stream_dedup.index.base import FeatureIndex
from stream_dedup.kafka.batches import source_of
from stream_dedup.kafka.client import (
    MAX_BACKOFF_S,
    is_retriable,
    outcome,
    retrieve_later,
    retry,
    send_batched,
    stop_within,
)
from stream_dedup.kafka.decisions import Message, Topics, as_record, messages_for
from stream_dedup.kafka.dialects import dialect_for
from stream_dedup.kafka.messages import page_from_message
from stream_dedup.kafka.topics import Limits
from stream_dedup.metrics import Metrics
from stream_dedup.models import Decision, Page, Rejected, position_id
from stream_dedup.runner.edges import STOP_GRACE_S, Abandoned, Batch, pause

log = logging.getLogger("stream_dedup.kafka")

POSITION_TIMEOUT_S = 0.5  # a partition without a fetch position yet is skipped for lag
REFORM_TIMEOUT_S = 120.0  # how long a restart waits for the records of the batch in flight
# A commit refused because the group moved on: the records go to their new owner.
REBALANCED = (CommitFailedError, IllegalStateError, RebalanceInProgressError,
              UnknownMemberIdError, IllegalGenerationError)
TOO_LARGE = (MessageSizeTooLargeError, RecordTooLargeError)


def partition_names(partitions: Sequence[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in partitions)


def _partition(stream: str) -> TopicPartition:
    topic, partition = stream.rsplit("/", 1)
    return TopicPartition(topic, int(partition))


def batch_of(records: list[ConsumerRecord], received: float | None = None, *,
             planned: bool = True) -> Batch:
    return Batch.of(((f"{r.topic}/{r.partition}", r.offset, r) for r in records), received,
                    planned=planned)


class FinishBeforeRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, source: KafkaSource) -> None:
        self._source = source

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self._source.lock:  # the batch in flight is delivered and committed first
            log.info("partitions revoked: %s", partition_names(revoked))
            self._source.metrics.forget_partitions((tp.topic, tp.partition) for tp in revoked)
            self._source.forget_read_ahead(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("partitions assigned: %s", partition_names(assigned))
        source = self._source
        source.adopt_plan(assigned)  # and what was read ahead under the assignment before
        stored = source.index.offsets()
        for tp in assigned:
            offset = stored.get(f"{tp.topic}/{tp.partition}")
            if offset is not None:
                source.consumer.seek(tp, offset)
                log.info("%s/%d: resuming at offset %d, as stored in the index",
                         tp.topic, tp.partition, offset)


class KafkaSource:
    redelivers = True
    live = True
    reads_ahead = False  # a batch is held against rebalances until it is committed

    def __init__(self, settings: Settings, consumer: AIOKafkaConsumer, index: FeatureIndex,
                 metrics: Metrics) -> None:
        self.settings = settings
        self.consumer = consumer
        self.index = index
        self.metrics = metrics
        self.lock = asyncio.Lock()
        self.listener = FinishBeforeRevoke(self)
        self.dialect = dialect_for(settings)  # None: the plain json / html reading
        self._fetch_delay = 0.5
        # Re-forming the batch that was in flight when a persistent index last stopped:
        # its plan, the records held until the plan's ranges are all fetched, and the
        # records fetched beyond them (the next batch).
        self._plan: list[tuple[TopicPartition, int, int]] | None = None
        self._plan_deadline = 0.0
        self._held: dict[TopicPartition, list[ConsumerRecord]] = {}
        # Records fetched and not yet handed out: beyond a plan's ranges, or read ahead
        # (decided).
        self._carry: dict[TopicPartition, list[ConsumerRecord]] = {}

    def adopt_plan(self, assigned: list[TopicPartition]) -> None:
        """After an assignment: decide the batch a crash left in flight exactly as it was
        first decided (same records, same order), if this consumer owns all its partitions;
        a redelivered batch cut differently could decide a near-duplicate pair spread over
        two partitions the other way round."""
        self._held, self._carry, self._plan = {}, {}, None
        plan = self.index.inflight()
        if not plan:
            return
        steps = [(_partition(stream), first, end) for stream, first, end in plan]
        missing = sorted({f"{tp.topic}/{tp.partition}" for tp, _, _ in steps} -
                         {f"{tp.topic}/{tp.partition}" for tp in assigned})
        if missing:
            log.warning("the batch in flight at the last stop also covered %s, now assigned "
                        "elsewhere: its records are decided as they come", ", ".join(missing))
            return
        self._plan, self._plan_deadline = steps, time.monotonic() + REFORM_TIMEOUT_S
        log.info("deciding the batch in flight at the last stop again, as it was: %s",
                 ", ".join(f"{tp.topic}/{tp.partition}@{f}..{e - 1}" for tp, f, e in steps))

    async def fetch(self, max_records: int, stop: asyncio.Event) -> Batch:
        try:
            fetched = await self._next(max_records)
        except KafkaError as exc:
            self.metrics.kafka_error("fetch")
            if not is_retriable(exc):
                raise KafkaDeliveryError(f"fetching records: {type(exc).__name__}: "
                                         f"{exc}") from exc
            log.warning("fetching records failed (%s: %s); retrying in %.1f s",
                        type(exc).__name__, exc, self._fetch_delay)
            await pause(stop, self._fetch_delay)
            self._fetch_delay = min(self._fetch_delay * 2, MAX_BACKOFF_S)
            return Batch([])
        self._fetch_delay = 0.5
        received = time.time()
        await self._observe_lag()
        return batch_of([r for records in fetched.values() for r in records], received)

    async def _next(self, max_records: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        if self._carry:
            fetched, self._carry = self._carry, {}
            if self._plan is None:  # and what the fetcher holds by now
                await self._take_fetched(fetched, max_records)
            return fetched
        fetched = await self.consumer.getmany(timeout_ms=500, max_records=max_records)
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

    @contextlib.asynccontextmanager
    async def hold(self, batch: Batch) -> AsyncIterator[Batch]:
        async with self.lock:
            yield self.owned(batch)

    async def decided(self) -> None:
        """The batch held is decided: what aiokafka fetched as it began is taken into the
        carry now, so that it fetches again at once, while the batch is delivered and
        committed (aiokafka fetches a partition again only once what it fetched last is
        taken). Without this, a record that arrived while the batch was decided waited
        for the batch after next. Once, not all through the delivery: a fetch for every
        arrival took the event loop from the delivery (1.7 -> 3.2 ms a batch)."""
        # Not in a rebalance: aiokafka's getmany then waits, whatever its timeout, for the
        # new assignment, which waits for the revoke, which waits for this batch's lock (a
        # deadlock: tests/test_service.py's rebalance test hung 2 runs in 5). The flag is
        # read in the same step as getmany's own check of it (nothing awaited between).
        rebalancing = self.consumer._subscription.reassignment_in_progress  # noqa: SLF001
        if self._plan is None and not rebalancing:
            with contextlib.suppress(KafkaError):  # the next fetch meets it again, and says so
                await self._take_fetched(self._carry, self.settings.batch_size)

    async def _take_fetched(self, into: dict[TopicPartition, list[ConsumerRecord]],
                            up_to: int) -> None:
        """What the consumer has fetched already (no wait), added to `into` until it holds
        `up_to` records."""
        room = up_to - sum(len(records) for records in into.values())
        if room > 0:
            for tp, records in (await self.consumer.getmany(timeout_ms=0,
                                                            max_records=room)).items():
                into.setdefault(tp, []).extend(records)

    def forget_read_ahead(self, revoked: Sequence[TopicPartition]) -> None:
        """A revoke: the records read ahead of its partitions go to their next owner (an
        assignment forgets all of them: adopt_plan)."""
        for tp in revoked:
            self._carry.pop(tp, None)

    def owned(self, batch: Batch) -> Batch:
        """The batch's records of the partitions still assigned (under the lock)."""
        owned = self.consumer.assignment()
        kept = [r for r in batch.records if TopicPartition(r.topic, r.partition) in owned]
        if len(kept) == len(batch.records):
            return batch
        log.info("abandoned %d records of revoked partitions (not committed)",
                 len(batch.records) - len(kept))
        return batch_of(kept, batch.received)

    def item(self, record: Any) -> Page | Rejected:
        return page_from_message(
            record.value, record.key, list(record.headers or ()),
            source_of(record.topic, record.partition, record.offset),
            input_format=self.settings.input_format, max_bytes=self.settings.max_page_bytes,
            position=position_id(record.timestamp, record.partition, record.offset),
            dialect=self.dialect,
        )

    async def commit(self, batch: Batch, stop: asyncio.Event) -> None:
        offsets = {_partition(stream): end for stream, end in batch.positions.items()}
        started = time.perf_counter()
        try:
            await retry("committing offsets", lambda: self.consumer.commit(offsets), stop,
                        lambda _: self.metrics.kafka_error("commit"))
        except REBALANCED as exc:
            log.warning("commit refused (%s): the group rebalanced; the new owner of these "
                        "partitions gets their records again", type(exc).__name__)
        except KafkaError as exc:
            raise KafkaDeliveryError(f"committing offsets: {type(exc).__name__}: {exc}") from exc
        self.metrics.commit_seconds.observe(time.perf_counter() - started)

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


class KafkaSink:
    def __init__(
        self,
        settings: Settings,
        producer: AIOKafkaProducer | None,  # None until the service has made it (new_producer)
        metrics: Metrics,
        limits: Limits | None = None,
        new_producer: Callable[[], Awaitable[AIOKafkaProducer]] | None = None,
    ) -> None:
        self.producer = producer
        self.metrics = metrics
        self.limits = limits or Limits()
        # A producer that hit a non-retriable error (its idempotent sequence numbers may no
        # longer match the broker's) is replaced by a new one before anything is resent.
        self.new_producer = new_producer
        self.topics = Topics(settings.decisions_topic, settings.kept_topic,
                             settings.dead_letter_topic)

    async def deliver(self, batch: Batch, items: Sequence[Page | Rejected],
                      decisions: Sequence[Decision], stop: asyncio.Event) -> None:
        await self._send(self.messages(batch, items, decisions), stop)
        self.metrics.dead_letters.inc(sum(d.decision == "reject" for d in decisions))

    def messages(self, batch: Batch, items: Sequence[Page | Rejected],
                 decisions: Sequence[Decision]) -> list[Message]:
        """Every output of the batch, each within its topic's limit."""
        messages: list[Message] = []
        for record, item, d in zip(batch.records, items, decisions, strict=True):
            for_record, reduced = messages_for(as_record(record), item, d, self.topics,
                                               self.limits.of)
            messages += for_record
            for output in reduced:
                self.metrics.reduced.labels(output).inc()
                log.warning("%s: the %s for this record is larger than its topic accepts; "
                            "sent reduced", item.source, output)
        return messages

    async def _send(self, messages: list[Message], stop: asyncio.Event) -> None:
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
                elif isinstance(exc, OutOfOrderSequenceNumber):
                    # a batch before it in its partition was refused (too large): the
                    # sequence numbers this producer holds no longer match the broker's
                    again.append(msg)
                    renew = True
                elif is_retriable(exc):
                    again.append(msg)
                else:
                    raise KafkaDeliveryError(f"sending to {msg.topic}: {type(exc).__name__}: "
                                             f"{exc}") from exc
            if renew and self.new_producer is not None:
                old, self.producer = self.producer, await self.new_producer()
                if old is not None:
                    await stop_within(old, STOP_GRACE_S)
            if stop.is_set():
                raise Abandoned("sending")
            exc = failed[0][1]
            log.warning("%d of %d messages not acknowledged (%s: %s); sending them again in "
                        "%.1f s", len(failed), len(pending), type(exc).__name__, exc, delay)
            await pause(stop, delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
            pending = again

    async def _attempt(self, messages: list[Message]) -> list[tuple[Message, BaseException]]:
        """Send once; the messages that failed, with why (a message's outcome is its record
        batch's)."""
        assert self.producer is not None, "the service makes the producer before run()"
        acks = await send_batched(self.producer, [(m.topic, m.key, m.value, m.headers)
                                                  for m in messages])
        batches = {a for a in acks if isinstance(a, asyncio.Future)}
        try:
            if batches:
                await asyncio.wait(batches)
        except asyncio.CancelledError:
            # A stop past the grace: what was queued fails when the producer closes; read
            # then, not logged as "Future exception was never retrieved"
            retrieve_later(batches)
            raise
        return [(msg, why) for msg, why in zip(messages, map(outcome, acks), strict=True)
                if why is not None]
