"""The aiokafka edge: the clients `serve` uses, built from Settings, made safe to run long.

Everything that knows aiokafka's keyword arguments or works around its behaviour is here,
with the retry policy the Kafka edges and the service follow (by aiokafka's `retriable`
flag, with backoff; a stop cuts any wait short: runner/loop.py's stop policy); `kafka/edges.py`
holds the runner's source and sink over these clients.

Things aiokafka does not do by itself, each reproduced against a real broker:

- **A record it cannot read.** A header key that is not UTF-8 makes aiokafka's record
  reader raise inside `getmany`, for that record on every fetch: the stream stops for good.
  `tolerating.ToleratingRecords` reads batches with aiokafka's fast reader and, for a
  batch it refuses, goes on with `batches.read_batch` (header keys decoded with
  `surrogateescape`), so the record arrives and `messages.py` turns it into a
  `bad-header` dead letter.
- **A broker that is down.** A failed metadata update is retried at once, and the fetcher
  and the sender wait on that retry in loops: with the broker stopped the process spun at
  50-73 % CPU writing ~21,000 ERROR lines a second, and counted none of it.
  `throttle_metadata` makes a failed update wait (0.1 s doubling to 5 s, reset by a
  success) and counts it (`stream_dedup_kafka_errors_total{operation="metadata"}`);
  `RateLimitedLog` keeps at most a few lines per message per interval and says how many it
  dropped.
- **Topics that do not exist, and message size limits**: kafka/topics.py.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import aiokafka.producer.sender as sender_module
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner

from stream_dedup.config import Settings
from stream_dedup.errors import ConfigError
from stream_dedup.kafka.secure import explain, security_kwargs
from stream_dedup.kafka.tolerating import install_tolerating_reader
from stream_dedup.runner.edges import Abandoned, pause

log = logging.getLogger("stream_dedup.kafka")

METADATA_BACKOFF_S = (0.1, 5.0)  # first and longest wait after a failed metadata update
DEFAULT_MESSAGE_MAX = 1_048_588  # Kafka's default message.max.bytes
PRODUCER_MAX_REQUEST = 16 * 1024 * 1024  # the client's own cap; the broker's limits decide
# The producers' batches: a batch's messages go in few requests. (aiokafka's default, 16 KB,
# made each kept page or changelog record a batch of its own, with one request in flight a
# partition: `bench/exactly_once.py`'s backlog went from 1,115 to 1,952 pages/s with
# --exactly-once, 1,487 to 2,169 without.)
DEFAULT_BATCH = 512 * 1024
STOP_CANCEL_S = 1.0  # how long a client's stop, cancelled, may take to end
TXN_RETRY_S = 0.002  # a transaction's start refused while the last one ends: asked again


# --- clients ------------------------------------------------------------------------------
def consumer_kwargs(s: Settings) -> dict[str, Any]:
    return {
        "bootstrap_servers": s.bootstrap_servers,
        "group_id": s.group_id,
        "enable_auto_commit": False,  # offsets are committed by the runner, after the acks
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": max(1_048_576, s.max_page_bytes + 65_536),
        "fetch_max_bytes": 64 * 1024 * 1024,
        "isolation_level": "read_committed",
        **security_kwargs(s),
    }


def partition_of(key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
    """aiokafka's default partitioner (murmur2 of the key), but the only partition of a
    one-partition topic without hashing: its murmur2 is pure Python, ~3 % of `serve`'s CPU at
    800 pages/s (py-spy, bench/RESULTS.md), for an answer that cannot be another."""
    if len(all_partitions) == 1:
        return all_partitions[0]
    chosen: int = DefaultPartitioner()(key, all_partitions, available)
    return chosen


def producer_kwargs(s: Settings, max_batch: int = DEFAULT_BATCH) -> dict[str, Any]:
    return {
        "bootstrap_servers": s.bootstrap_servers,
        "acks": "all",
        "enable_idempotence": True,  # retries inside the client do not duplicate
        "linger_ms": 5,
        "max_request_size": PRODUCER_MAX_REQUEST,
        # The broker holds a whole record batch to a topic's max.message.bytes: small
        # messages packed together must stay under the smallest limit (Limits.batch).
        "max_batch_size": max_batch,
        "compression_type": None,
        "partitioner": partition_of,
        **security_kwargs(s),
    }


def make_consumer(s: Settings, failed: Callable[[], None]) -> AIOKafkaConsumer:
    install_tolerating_reader()
    consumer = AIOKafkaConsumer(**consumer_kwargs(s))
    throttle_metadata(consumer._client, failed)  # noqa: SLF001 (no public handle to it)
    return consumer


def make_producer(s: Settings, failed: Callable[[], None],
                  max_batch: int = DEFAULT_BATCH, **extra: Any) -> AIOKafkaProducer:
    """`extra`: more keyword arguments (a transactional id and its timeout)."""
    # A transaction begun while the last one's markers are still being written is refused
    # (CONCURRENT_TRANSACTIONS) and asked again after aiokafka's 20 ms: back to back
    # transactions each waited that long (48 -> 27 ms a transaction with 2 ms).
    sender_module.BACKOFF_OVERRIDE = TXN_RETRY_S
    producer = AIOKafkaProducer(**{**producer_kwargs(s, max_batch), **extra})
    throttle_metadata(producer.client, failed)
    return producer


def send_now(producer: AIOKafkaProducer) -> None:
    """Hand every record batch the producer holds to its sender at once, not after
    linger_ms: for a caller that has sent all it has and now waits for the acks (a runner
    batch's outputs), nothing more would join them meanwhile, so the linger would only add
    itself to every batch's delivery. (What aiokafka's `flush_for_commit` does for a
    transaction's batches, without waiting for them.) A producer without aiokafka's
    accumulator (a test's stand-in) holds nothing back."""
    accumulator = getattr(producer, "_message_accumulator", None)
    if accumulator is None:
        return
    try:  # aiokafka's internals: another version may lay them out otherwise (then: linger)
        for batches in accumulator._batches.values():  # noqa: SLF001
            for batch in batches:
                # no more records in it: ready, whatever its age
                batch._builder.close()  # noqa: SLF001
        waiter = accumulator.waiter()  # what the sender waits on (aiokafka 0.14)
        if not waiter.done():
            waiter.set_result(None)  # the sender looks again now
    except AttributeError:
        return


# What send_batched sends: topic, key (the partitioner's choice of partition), value, headers.
Send = tuple[str, bytes | None, bytes | None, Sequence[tuple[str, bytes]]]


async def send_batched(producer: AIOKafkaProducer,
                       sends: Sequence[Send]) -> list[asyncio.Future[Any] | BaseException]:
    """Queue every send as part of a whole record batch, the sends of one partition in
    order; each batch is closed, so the sender takes it at once (no linger). For each send:
    the future of its batch (the broker writes or refuses a batch whole, as it does the
    batches that `send` fills), or the KafkaError that kept it from being queued: the
    broker's metadata unreachable (then none is queued: a wait for it is not repeated for
    every topic), or its partition's queue still full after request_timeout_ms (then the
    sends of that partition after it are not queued either).

    Not a `send` a message: its futures, checks and accumulator lookups cost 74 µs of CPU a
    message, batches 31 (54 messages of 0.3 and 10 kB, one partition, local broker); two
    messages a page at 800 pages/s. Not for a transaction's sends: there a transaction took
    15.0 and 16.2 ms a batch, not 14.4 and 13.1, and p99 at 800/s was 314 and 363 ms, not
    236 and 278 (bench/exactly_once.py, the two alternated, twice). A producer without
    `create_batch` (a test's stand-in) gets a `send` each."""
    if not hasattr(producer, "create_batch"):
        return [await _send_one(producer, s) for s in sends]
    partitions: dict[str, list[int]] = {}
    groups: dict[TopicPartition, list[int]] = {}
    for i, (topic, key, _, _) in enumerate(sends):
        if topic not in partitions:
            try:
                partitions[topic] = sorted(await producer.partitions_for(topic))
            except KafkaError as exc:
                return [exc] * len(sends)
        known = partitions[topic]  # all taken as available: only a keyless send's would differ
        groups.setdefault(TopicPartition(topic, partition_of(key, known, known)), []).append(i)
    out: list[asyncio.Future[Any] | BaseException | None] = [None] * len(sends)
    try:
        for tp, members in groups.items():
            try:
                await _queue_partition(producer, sends, members, tp, out)
            except KafkaError as exc:
                for i in members:
                    if out[i] is None:
                        out[i] = exc
    except asyncio.CancelledError:  # what was queued fails when the producer closes
        retrieve_later({f for f in out if isinstance(f, asyncio.Future)})
        raise
    return out  # type: ignore[return-value]  # every send has its future or error now


async def _queue_partition(producer: AIOKafkaProducer, sends: Sequence[Send],
                           members: list[int], tp: TopicPartition,
                           out: list[asyncio.Future[Any] | BaseException | None]) -> None:
    """The sends `members` of one partition, in batches as full as max_batch_size allows (a
    record larger than that goes alone: a batch's first record always fits)."""
    builder = producer.create_batch()
    held: list[int] = []
    for i in members:
        _, key, value, headers = sends[i]
        record = {"timestamp": None, "key": key, "value": value, "headers": list(headers)}
        if builder.append(**record) is None:
            await _queue(producer, builder, tp, held, out)
            builder, held = producer.create_batch(), []
            builder.append(**record)
        held.append(i)
    await _queue(producer, builder, tp, held, out)


async def _queue(producer: AIOKafkaProducer, builder: Any, tp: TopicPartition,
                 held: list[int], out: list[asyncio.Future[Any] | BaseException | None]) -> None:
    builder.close()  # ready: the sender takes it without waiting out linger_ms
    future = await producer.send_batch(builder, tp.topic, partition=tp.partition)
    for i in held:
        out[i] = future


def outcome(ack: asyncio.Future[Any] | BaseException) -> BaseException | None:
    """Why a send of send_batched failed (its batch's future done), or None."""
    if isinstance(ack, BaseException):
        return ack
    return asyncio.CancelledError() if ack.cancelled() else ack.exception()


async def _send_one(producer: AIOKafkaProducer, s: Send) -> asyncio.Future[Any] | BaseException:
    topic, key, value, headers = s
    try:
        ack: asyncio.Future[Any] = await producer.send(topic, value, key=key,
                                                       headers=list(headers))
    except KafkaError as exc:
        return exc
    return ack


async def stop_within(client: AIOKafkaConsumer | AIOKafkaProducer, seconds: float) -> None:
    """Close a client, giving up after `seconds`: with the broker down, a producer's stop
    waits for acknowledgements that cannot come (what was not acknowledged was not
    committed either, so it is delivered again), and a consumer's stop waits for its
    coordination task, which may be inside a rebalance. Not `wait_for`: it waits for the
    cancelled stop to end, and a stop that swallows its cancellation never does."""
    task = asyncio.ensure_future(client.stop())
    name = type(client).__name__
    try:
        await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=STOP_CANCEL_S)
    if not task.done():
        task.add_done_callback(_retrieve)
        log.warning("closing the %s: not done within %.0f s; left behind", name, seconds)
    elif task.cancelled():
        # The consumer's stop cancels its fetch tasks and lets that cancellation out when
        # one of them is in a backoff sleep (broker down); or ours, past `seconds`.
        log.warning("closing the %s: cancelled after %.0f s", name, seconds)
    elif task.exception() is not None:
        exc = task.exception()
        log.warning("closing the %s: %s; left behind", name, type(exc).__name__)


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Read a finished future's outcome, so that nothing logs "exception was never
    retrieved" for a future no one waits for any more."""
    if not future.cancelled():
        future.exception()


def retrieve_later(futures: Iterable[asyncio.Future[Any]]) -> None:
    for future in futures:
        future.add_done_callback(_retrieve)


# --- retries -----------------------------------------------------------------------------
MAX_BACKOFF_S = 30.0
T = TypeVar("T")


def is_retriable(exc: BaseException) -> bool:
    """aiokafka's own flag, plus timeouts and lost connections (which it leaves unflagged)."""
    return bool(getattr(exc, "retriable", False)) or isinstance(
        exc, KafkaTimeoutError | KafkaConnectionError)


# Refusals that the same request meets again however often it is made: a service that
# starts over on one (a transaction's failure, exactly-once) would start over forever.
# UnknownError: a code this aiokafka does not know (InvalidRecord, 87: a compacted topic
# refusing a record without a key). Everything else failing a transaction (fenced, timed
# out, a lost coordinator) is worth a start over.
FATAL: tuple[type[KafkaError], ...] = (
    kafka_errors.TopicAuthorizationFailedError, kafka_errors.GroupAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
    kafka_errors.TransactionalIdAuthorizationFailed, kafka_errors.AuthenticationFailedError,
    kafka_errors.SaslAuthenticationFailed, kafka_errors.UnknownError,
    kafka_errors.CorruptRecordException, kafka_errors.InvalidTopicError,
    kafka_errors.PolicyViolationError, kafka_errors.UnsupportedVersionError,
    kafka_errors.UnsupportedForMessageFormatError, kafka_errors.InvalidTransactionTimeout,
    kafka_errors.InvalidConfigurationError, kafka_errors.IncompatibleBrokerVersion)


def is_fatal(exc: BaseException) -> bool:
    """Refused for good: no retry and no start over gets past it (FATAL)."""
    return isinstance(exc, FATAL)


async def retry(what: str, attempt: Callable[[], Awaitable[T]], stop: asyncio.Event,
                failed: Callable[[KafkaError], None] | None = None,
                settings: Settings | None = None) -> T:
    """Run `attempt` until it succeeds, with exponential backoff, logging (and telling
    `failed` about) every failure. A non-retriable error is raised as it is; a stop during
    the backoff raises Abandoned. With `settings`, a refusal no retry gets past (a wrong
    password, a certificate not trusted: kafka/secure.py `explain`) raises ConfigError,
    one line naming the setting to fix."""
    delay, attempts = 0.5, 0
    while True:
        try:
            return await attempt()
        except (KafkaError, ssl.SSLError) as exc:
            attempts += 1
            if failed is not None and isinstance(exc, KafkaError):
                failed(exc)
            line = explain(exc, settings, attempts) if settings is not None else None
            if line is not None:
                raise ConfigError(line) from None
            if not isinstance(exc, KafkaError) or not is_retriable(exc):
                raise
            if stop.is_set():
                raise Abandoned(what) from exc
            log.warning("%s failed (%s: %s); retrying in %.1f s", what, type(exc).__name__,
                        exc, delay)
            await pause(stop, delay)
            delay = min(delay * 2, MAX_BACKOFF_S)


# --- a broker that is down ----------------------------------------------------------------
def throttle_metadata(client: Any, failed: Callable[[], None]) -> None:
    """Make every failed metadata update of `client` (an AIOKafkaClient) wait before the
    next one can start, with exponential backoff, and report it to `failed`."""
    # aiokafka has no hook on a failed metadata update (retry_backoff_ms does not reach it)
    update = client._metadata_update  # noqa: SLF001
    wait = [METADATA_BACKOFF_S[0]]

    async def throttled(cluster_metadata: Any, topics: Any) -> bool:
        ok = bool(await update(cluster_metadata, topics))
        if ok:
            wait[0] = METADATA_BACKOFF_S[0]
        else:
            failed()
            await asyncio.sleep(wait[0])
            wait[0] = min(wait[0] * 2, METADATA_BACKOFF_S[1])
        return ok

    client._metadata_update = throttled  # noqa: SLF001


class RateLimitedLog(logging.Filter):
    """At most `burst` records per (logger, message template) per `interval` seconds; the
    first record after a quiet interval says how many were dropped. For aiokafka's loggers,
    which log every failed connection attempt at ERROR."""

    def __init__(self, interval: float = 10.0, burst: int = 3,
                 clock: Callable[[], float] = time.monotonic,
                 on_drop: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self.interval, self.burst, self.clock, self.on_drop = interval, burst, clock, on_drop
        self._windows: dict[tuple[str, str], list[float]] = {}  # key -> [start, count, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self.clock()
        window = self._windows.get(key)
        if window is None or now - window[0] >= self.interval:
            if window is not None and window[2]:
                record.msg = f"{record.msg} [{int(window[2])} similar lines dropped in the " \
                             f"last {self.interval:.0f} s]"
            if len(self._windows) > 1000:  # message templates are few; bound it anyway
                self._windows.clear()
            self._windows[key] = [now, 1, 0]
            return True
        window[1] += 1
        if window[1] <= self.burst:
            return True
        window[2] += 1
        self.on_drop()
        return False


def quiet_aiokafka_logs(on_drop: Callable[[], None] = lambda: None,
                        interval: float = 10.0) -> RateLimitedLog:
    """Rate-limit every aiokafka logger (replacing an earlier limiter of this process)."""
    limiter = RateLimitedLog(interval, on_drop=on_drop)
    names = ["aiokafka", *(n for n in logging.root.manager.loggerDict
                           if n.startswith("aiokafka."))]
    for name in names:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, RateLimitedLog)]:
            logger.removeFilter(old)
        logger.addFilter(limiter)
    return limiter
