"""`serve --exactly-once`: every batch commits in one Kafka transaction (KIP-98).

    fetch (read_committed) -> a batch = one input partition's records -> decide
      -> begin a transaction on that partition's producer
         send the decisions, kept pages, dead letters, and the index's changes (kafka/changelog.py)
         send_offsets_to_transaction(the batch's end offset, the group)
      -> commit the transaction -> commit the index

**Fencing.** aiokafka (0.14) commits offsets in a transaction with TxnOffsetCommit v0: the
group id alone, no generation or member id (KIP-447 is not there), so the group
coordinator cannot refuse a commit from an instance that lost its partitions. The fence is
the transactional id, one per input partition: `<group>-<topic>-<partition>`. Whoever is
given a partition first starts its producer (InitProducerId), then reads the partition's
committed offset. InitProducerId first completes or aborts the last transaction of that
id and bumps its epoch, so
- an instance that still acts on the partition (stalled past the session timeout, then
  back) is refused on its next send or commit (ProducerFenced): its open transaction is
  aborted, nothing of it visible to read_committed readers;
- the new owner reads an offset no pending transaction can still move, and resumes there.
One id a partition means one transaction a partition: a batch holds one partition's records.
Within an instance, a batch is decided only in the assignment it was fetched in
(TransactionalSource): one taken from the queue before a revoke is dropped, not delivered
under the producer (or the epoch) of the next assignment.

**The index** changes when a batch is decided, before its transaction commits; the changes
must count only if the transaction does. A memory or LSM index keeps a changelog topic
(compacted, one partition, checked at start: kafka_topics.check_changelog): each batch's
kept pages are written in its transaction. The index stores the changelog position it has
read up to (kafka/restore.py; the LSM on disk, the memory index in memory: 0 at start) and claims
again what the changelog holds past it: before joining the group, then at every assignment
once the partitions' producers are started (so a transaction an earlier owner was still
committing is read, not missed), and at least every CATCH_UP_S. A page the index holds
already is left out (changelog.claim_again), so what this instance kept itself is not
claimed twice, and what other instances sharing the changelog kept is learnt. After a
crash between the Kafka commit and the index's own, the index catches up; a batch whose
transaction did not commit left nothing (read_committed never shows it) and is decided
again against the same state. A transaction that fails in a running service (fenced,
timed out, a broker restart) is aborted and the service starts over in process: the index
reopened at its last commit and restored from the changelog, a new consumer in the group
(`TransactionFailed`); a refusal no start over gets past (kafka_client.FATAL: not
authorized, a record the topic refuses) stops it instead (KafkaDeliveryError, exit 1). A
Redis index keeps no changelog: its claims are keyed by page id (the input position) and a
page decided again gets the decision its first claim recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from stream_dedup.config import Settings
from stream_dedup.errors import KafkaDeliveryError, StreamDedupError
from stream_dedup.kafka import changelog
from stream_dedup.kafka.client import (
    is_fatal,
    make_producer,
    retrieve_later,
    retry,
    send_now,
    stop_within,
)
from stream_dedup.kafka.edges import (
    FinishBeforeRevoke,
    KafkaSink,
    KafkaSource,
    batch_of,
    partition_names,
)
from stream_dedup.metrics import Metrics
from stream_dedup.models import Decision, Page, Rejected
from stream_dedup.runner.edges import STOP_GRACE_S, Abandoned, Batch, Faults, within_grace

log = logging.getLogger("stream_dedup.kafka")

ABORT_TIMEOUT_S = 10.0
# A memory or LSM index reads the changelog again at least this often (besides at every
# assignment): it learns what other instances kept, and its stored position moves on (an
# LSM index's restart reads from there)
CATCH_UP_S = 300.0


class TransactionFailed(StreamDedupError):
    """A batch's transaction did not commit: the service starts over from the last commit."""


def failure(what: str, exc: BaseException) -> StreamDedupError:
    """A Kafka error met in `what`: refused for good (kafka_client.FATAL: the service stops,
    exit 1), or worth a start over from the last commit (TransactionFailed)."""
    if is_fatal(exc):
        hint = (" (a code this client does not know; InvalidRecord, 87, is a compacted topic "
                "refusing a record without a key)" if type(exc).__name__ == "UnknownError"
                else "")
        return KafkaDeliveryError(f"{what}: {type(exc).__name__}: {exc}{hint}; refused for "
                                  "good, not started over")
    return TransactionFailed(f"{what} ({type(exc).__name__}: {exc})")


def transactional_id(settings: Settings, tp: TopicPartition) -> str:
    return f"{settings.group_id}-{tp.topic}-{tp.partition}"


class Producers:
    """One transactional producer per assigned input partition."""

    def __init__(self, settings: Settings, metrics: Metrics, max_batch: int) -> None:
        self.settings, self.metrics, self.max_batch = settings, metrics, max_batch
        self.by_partition: dict[TopicPartition, AIOKafkaProducer] = {}

    async def open(self, tps: Iterable[TopicPartition], stop: asyncio.Event) -> None:
        """Start a producer for each partition: its InitProducerId fences an earlier owner."""
        for tp in tps:
            if tp in self.by_partition:
                continue
            producer = make_producer(self.settings, lambda: self.metrics.kafka_error(
                "metadata"), self.max_batch, transactional_id=transactional_id(
                    self.settings, tp),
                transaction_timeout_ms=int(self.settings.transaction_timeout_s * 1000))
            try:  # InitProducerId waits for an earlier owner's transaction to end: bounded
                await retry(f"starting the transactional producer of {tp.topic}/"
                            f"{tp.partition}", lambda p=producer: within_grace(p.start(), stop),
                            stop, lambda _: self.metrics.kafka_error("connect"))
            except BaseException:
                await stop_within(producer, STOP_GRACE_S)
                raise
            self.by_partition[tp] = producer

    async def close(self, tps: Iterable[TopicPartition] | None = None) -> None:
        chosen = list(self.by_partition) if tps is None else list(tps)
        closing = [self.by_partition.pop(tp) for tp in chosen if tp in self.by_partition]
        await asyncio.gather(*(stop_within(p, STOP_GRACE_S) for p in closing))


class _FenceThenResume(FinishBeforeRevoke):
    """Revoked: the batch in flight is committed first, then the partition's producer goes.
    Assigned: the partition's producer starts first (fencing an earlier owner, completing
    its last transaction), then the consumer resumes at the committed offset, read again."""

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await super().on_partitions_revoked(revoked)
        source = self._source
        assert isinstance(source, TransactionalSource)
        source.drop(revoked)
        await source.producers.close(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        source = self._source
        assert isinstance(source, TransactionalSource)
        # Paused before anything is fetched (aiokafka calls this before its first fetch of
        # them can run): a record read at a stale committed offset would be decided, and
        # a fetch in flight across the seek below can hand out records past a gap. They
        # are resumed by the runner's next fetch, once the index has read the changelog.
        source.consumer.pause(*assigned)
        source.generation += 1
        log.info("partitions assigned: %s", partition_names(assigned))
        try:
            await source.producers.open(assigned, source.stop)
            for tp in assigned:
                committed = await within_grace(source.consumer.committed(tp), source.stop)
                if committed is None:
                    await source.consumer.seek_to_beginning(tp)  # auto_offset_reset earliest
                else:
                    source.consumer.seek(tp, committed)
                source.expected[f"{tp.topic}/{tp.partition}"] = committed or 0
                log.info("%s/%d: resuming at %s (transactional id %s)", tp.topic,
                         tp.partition, "the beginning" if committed is None else
                         f"offset {committed}", transactional_id(source.settings, tp))
        except (KafkaError, Abandoned) as exc:
            source.failed = exc  # the next fetch raises it: the session starts over
            return
        # The producers' InitProducerId completed or aborted every transaction the
        # partitions' earlier owners had open: the changelog holds all they committed.
        source.restore_pending = True


class TransactionalSource(KafkaSource):
    """KafkaSource whose batches are one partition's records each, and whose commit is the
    transaction's (the sink's): nothing to commit here.

    A batch is decided only in the assignment it was fetched in. The runner takes a batch
    (fetch), then holds it (hold, under the lock a revoke takes too); a revoke can come
    between the two, and aiokafka's assignment() still names the old partitions until the
    rejoin completes. Batches are stamped with the assignment's generation (bumped at every
    revoke and assignment): one of an earlier generation is dropped in hold(), its records
    read again from the committed offset by whoever owns the partition now."""

    def __init__(self, settings: Settings, consumer: AIOKafkaConsumer, index: Any,
                 metrics: Metrics, producers: Producers, stop: asyncio.Event,
                 restore: Callable[[Callable[[], Awaitable[None]]], Awaitable[int]]
                 | None = None) -> None:
        super().__init__(settings, consumer, index, metrics)
        self.producers, self.stop = producers, stop
        self.listener = _FenceThenResume(self)
        self._queue: list[tuple[int, Batch]] = []  # (generation, batch)
        self._taken: tuple[int, Batch] | None = None  # the batch fetch() handed out last
        self.generation = 0
        # The next offset to decide of each partition ready (its producer started, its
        # committed offset read and sought): aiokafka hands out records of a partition
        # while the listener still prepares it (seen: a batch decided before the seek, then
        # again after it). Records of a partition not ready, or before its next offset, are
        # dropped: the seek fetches them again.
        self.expected: dict[str, int] = {}
        self.failed: BaseException | None = None  # preparing an assigned partition failed
        # Partitions assigned and fenced, paused until the index has claimed what the
        # changelog holds (`restore`: given a keep-alive to call between its reads)
        self.restore_pending = False
        self.restore = restore
        self._next_catch_up = time.monotonic() + CATCH_UP_S

    def drop(self, revoked: Sequence[TopicPartition]) -> None:
        self.generation += 1
        gone = {f"{tp.topic}/{tp.partition}" for tp in revoked}
        for stream in gone:
            self.expected.pop(stream, None)
        self._queue = [(g, b) for g, b in self._queue if not gone & b.positions.keys()]

    async def fetch(self, max_records: int, stop: asyncio.Event) -> Batch:
        if self.failed is not None:
            raise failure("preparing an assigned partition", self.failed)
        if self.restore is not None and time.monotonic() >= self._next_catch_up:
            self.restore_pending = True  # the others' pages, and the position moved on
        if self.restore_pending:
            await self._restore(stop)
            return Batch([])
        if not self._queue:
            fetched = await super().fetch(max_records, stop)
            by_partition: dict[str, list[Any]] = {}
            for r in fetched.records:
                stream = f"{r.topic}/{r.partition}"
                if r.offset >= self.expected.get(stream, 1 << 63):
                    by_partition.setdefault(stream, []).append(r)
                    self.expected[stream] = r.offset + 1
            for records in by_partition.values():
                # no plan: the group's committed offset is where a restart resumes
                batch = batch_of(records, fetched.received, planned=False)
                self._queue.append((self.generation, batch))
        if not self._queue:
            return Batch([])
        self._taken = self._queue.pop(0)
        return self._taken[1]

    async def _restore(self, stop: asyncio.Event) -> None:
        """The index claims what the changelog holds (the partitions' earlier owners are
        fenced); then the partitions ready are resumed. The consumer is polled meanwhile
        (its partitions paused, nothing comes) so that a long restore does not count as a
        consumer that stopped polling (max.poll.interval.ms)."""
        self.restore_pending = False
        self._next_catch_up = time.monotonic() + CATCH_UP_S
        if self.restore is not None:
            try:
                await self.restore(self._keep_polling)
            except KafkaError as exc:
                raise failure("restoring the index from the changelog", exc) from exc
        if self.restore_pending or self.failed is not None:
            return  # assigned again meanwhile: restored again first
        ready = [tp for tp in self.consumer.assignment()
                 if f"{tp.topic}/{tp.partition}" in self.expected]
        self.consumer.resume(*ready)

    async def _keep_polling(self) -> None:
        got = await self.consumer.getmany(timeout_ms=0)
        for tp, records in got.items():  # none expected (paused): read again later
            if records:
                self.consumer.seek(tp, records[0].offset)

    @contextlib.asynccontextmanager
    async def hold(self, batch: Batch) -> AsyncIterator[Batch]:
        async with self.lock:
            taken, self._taken = self._taken, None
            streams = list(batch.positions)
            stale = (taken is not None and taken[1] is batch and taken[0] != self.generation
                     ) or any(stream not in self.expected for stream in streams)
            if stale:
                log.info("dropped a batch of %d records of %s taken before a rebalance (not "
                         "decided: read again from the committed offset by the partition's "
                         "owner)", len(batch.records), ", ".join(streams))
                yield Batch([])
                return
            yield self.owned(batch)

    async def decided(self) -> None:
        """No reading ahead (KafkaSource.decided): measured with it (bench/exactly_once.py,
        800 pages/s, two runs each way, alternated), batches grew from 14-16 pages to
        22-24, a transaction from 6-7 ms to 10, p50 from 40-42 ms to 46-49 and p99 from
        105-117 to 113-247. (Its rebalance tests passed with it: not the reason.)"""

    async def commit(self, batch: Batch, stop: asyncio.Event) -> None:
        pass  # committed with the batch's transaction


class TransactionalSink(KafkaSink):
    """Sends a batch's outputs, its index changes and its input offsets in one transaction
    of its partition's producer, and commits it; any failure aborts the transaction and
    raises TransactionFailed (a stop meanwhile: Abandoned, the transaction left to the
    broker's timeout or the next owner's fence)."""

    def __init__(self, settings: Settings, metrics: Metrics, producers: Producers,
                 journal: bool, faults: Faults | None = None) -> None:
        super().__init__(settings, None, metrics)
        self.settings, self.producers, self.journal = settings, producers, journal
        self.faults = faults or Faults()
        self.changelog = TopicPartition(settings.changelog(), 0)
        self.delivered = 0

    async def deliver(self, batch: Batch, items: Sequence[Page | Rejected],
                      decisions: Sequence[Decision], stop: asyncio.Event) -> None:
        (stream,) = batch.positions  # one partition a batch (TransactionalSource)
        topic, partition = stream.rsplit("/", 1)
        tp = TopicPartition(topic, int(partition))
        producer = self.producers.by_partition.get(tp)
        if producer is None:
            raise TransactionFailed(f"no producer for {stream}: the partition was revoked")
        outputs = self.messages(batch, items, decisions)
        # the batch's first record (a batch of skipped records only, none: nothing kept)
        first = min((r.offset for r in batch.records), default=batch.positions[stream] - 1)
        changes = changelog.records(batch.changes, f"{stream}/{first}") if self.journal else []
        self.delivered += 1
        started = time.perf_counter()
        acks: list[asyncio.Future[Any]] = []
        logs: list[asyncio.Future[Any]] = []
        try:
            await producer.begin_transaction()
            for m in outputs:
                acks.append(await producer.send(m.topic, m.value, key=m.key,
                                                headers=list(m.headers)))
            for key, value, headers in changes:
                logs.append(await producer.send(self.changelog.topic, value, key=key,
                                                headers=list(headers), partition=0))
            send_now(producer)
            results = await asyncio.gather(*acks, *logs, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:  # every send's outcome read (none left to log "never retrieved")
                raise failed[0]
            # After the acknowledgements: sent with them, its round trips met a refusal now
            # and then, and waited out aiokafka's 100 ms backoff (a p99 of 130 ms, not 54).
            await producer.send_offsets_to_transaction({tp: batch.positions[stream]},
                                                       self.settings.group_id)
            self.faults.at("before-transaction-commit", self.delivered)
            await producer.commit_transaction()
        except asyncio.CancelledError:
            # A stop past the grace: the broker aborts it (timeout, or the next fence). The
            # sends queued are failed by the producer's close: read, not logged as lost.
            retrieve_later([*acks, *logs])
            raise
        except (KafkaError, OSError) as exc:
            retrieve_later([*acks, *logs])  # a send that raised left the earlier ones
            self.metrics.transactions.labels("aborted").inc()
            self.metrics.kafka_error("produce")
            with contextlib.suppress(KafkaError, TimeoutError, OSError, Exception):
                await asyncio.wait_for(producer.abort_transaction(), ABORT_TIMEOUT_S)
            raise failure(f"the transaction of {stream} did not commit", exc) from exc
        self.metrics.transactions.labels("committed").inc()
        self.metrics.commit_seconds.observe(time.perf_counter() - started)
        self.metrics.dead_letters.inc(sum(d.decision == "reject" for d in decisions))
        # The index's changelog position is not moved past this batch's records: other
        # instances may have written before them (kafka/restore.py moves it, reading)
