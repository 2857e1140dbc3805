"""`stream-dedup serve`: the Kafka service around the runner.

Builds the aiokafka clients from Settings (the only place that knows their keyword
arguments), starts them with retries so a broker that is not up yet is waited for (and
said so in the log), runs the batch loop until SIGTERM/SIGINT, then finishes the batch in
flight, flushes, and closes: every decided record is committed and the exit code is 0.

    serve() ── aiohttp app (HTTP API on --http-host:--http-port; 0 = no listener)
                 └── cleanup_ctx: Service.run() task: load index -> connect -> Runner.run
The HTTP server and the runner share one event loop; deciding happens in the runner's
worker thread, so the loop keeps answering /metrics and /readyz during a batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from stream_dedup.config import Settings
from stream_dedup.errors import StreamDedupError
from stream_dedup.http.app import ApiState, Check, app_runner, build_app
from stream_dedup.index.base import Change
from stream_dedup.kafka import changelog
from stream_dedup.kafka.client import (
    DEFAULT_BATCH,
    make_consumer,
    make_producer,
    quiet_aiokafka_logs,
    retry,
    stop_within,
)
from stream_dedup.kafka.edges import KafkaSink, KafkaSource
from stream_dedup.kafka.restore import restore_index
from stream_dedup.kafka.topics import Limits, check_changelog, ensure_topics, read_limits
from stream_dedup.kafka.transactions import (
    Producers,
    TransactionalSink,
    TransactionalSource,
    TransactionFailed,
)
from stream_dedup.metrics import Metrics
from stream_dedup.pipeline.deduplicator import AnalysisPool, Deduplicator
from stream_dedup.runner.edges import Abandoned, Faults, pause, within_grace
from stream_dedup.runner.loop import Runner, RunStats
from stream_dedup.runner.signals import SIGNALS
from stream_dedup.security import kafka_security
from stream_dedup.sources.stats import SourceStats

log = logging.getLogger("stream_dedup.service")

PROBE_TIMEOUT_S = 3.0  # /readyz: how long a metadata request may take
CLOSE_TIMEOUT_S = 3.0  # closing the clients may wait this long on a broker that is down
JOURNAL_TIMEOUT_S = 10.0  # /v1/forget: writing its tombstones to the changelog, at most
RESTART_BACKOFF_S = (1.0, 30.0)  # --exactly-once: waits before a session starts over


async def serve(settings: Settings, stop: asyncio.Event | None = None,
                faults: Faults | None = None) -> int:
    """Run the service until `stop` (or SIGTERM/SIGINT/SIGHUP); the exit code. `faults`:
    crash injection, for tests."""
    stop = stop or asyncio.Event()
    if SIGNALS.install():  # already, from the command line's start (runner/signals.py)
        SIGNALS.attach(asyncio.get_running_loop(), stop)
    try:
        return await _serve(settings, stop, faults)
    finally:
        SIGNALS.detach()


async def _serve(settings: Settings, stop: asyncio.Event, faults: Faults | None) -> int:
    service = Service(settings, stop, faults)
    app = build_app(service.api)
    app[SERVICE] = service
    app.cleanup_ctx.append(_kafka_task)
    web_runner = app_runner(app)
    await web_runner.setup()  # starts the Kafka task
    try:
        if settings.http_port:
            host, port = settings.http_host, settings.http_port
            try:
                await web.TCPSite(web_runner, host, port).start()
            except OSError as exc:
                log.error("cannot serve HTTP on %s:%d (%s); --http-port 0 turns it off",
                          host, port, exc)
                return 1
            log.info("HTTP API on http://%s:%d: /metrics /healthz /readyz /v1/check /v1/stats",
                     host, port)
        assert service.task is not None
        return await asyncio.shield(service.task)
    finally:
        await web_runner.cleanup()  # sets stop and waits for the Kafka task


SERVICE: web.AppKey[Service] = web.AppKey("service")


async def _kafka_task(app: web.Application) -> AsyncIterator[None]:
    """The Kafka side hangs off the app: started with it, finished before it closes."""
    service = app[SERVICE]
    service.task = asyncio.create_task(service.run(), name="kafka")
    yield
    service.stop.set()
    await service.task


class Service:
    """Index, Kafka clients and runner of `serve`, and what the HTTP API reads of them."""

    def __init__(self, settings: Settings, stop: asyncio.Event,
                 faults: Faults | None = None) -> None:
        self.settings = settings
        self.stop = stop
        self.faults = faults
        self.metrics = Metrics(settings)
        self.api = ApiState(settings, self.metrics, broker=self.probe_broker,
                            index_problem=lambda: self.runner.index_problem if self.runner
                            else "",
                            pending=lambda: sum(self.metrics.lags.values()),
                            extra_stats=self.kafka_stats)
        self.runner: Runner | None = None
        self.consumer: AIOKafkaConsumer | None = None
        self.connected = False
        self.task: asyncio.Task[int] | None = None

    async def journal_forget(self, page_ids: list[int]) -> None:
        """A forget's tombstones on the changelog now, acknowledged (they also go with the
        next batch's transaction): a restore after a crash forgets those pages too."""
        producer = make_producer(self.settings, lambda: self.metrics.kafka_error("metadata"))
        await asyncio.wait_for(producer.start(), JOURNAL_TIMEOUT_S)
        try:
            sent = [await producer.send(self.settings.changelog(), None, key=key,
                                        headers=list(headers), partition=0)
                    for key, _, headers in changelog.records(
                        [Change(None, page_id) for page_id in page_ids], "forget")]
            await asyncio.wait_for(asyncio.gather(*sent), JOURNAL_TIMEOUT_S)
        finally:
            await producer.stop()

    async def run(self) -> int:
        settings = self.settings
        # Loading an index may take a while; /healthz answers and /readyz says so meanwhile.
        try:
            dedup = await asyncio.to_thread(Deduplicator, settings, None, self.metrics)
        except StreamDedupError as exc:
            log.error("cannot open the index: %s", exc)
            return 2
        if settings.exactly_once and settings.index != "redis":
            dedup.journal = []  # the changelog of the index (kafka/transactions.py)
            self.api.journal = self.journal_forget
        self.api.dedup = dedup
        pool = AnalysisPool(settings, settings.workers) if settings.workers > 1 else None
        if pool is not None:
            pool.start()  # in the background: a service runs long enough to use them
        quiet_aiokafka_logs(on_drop=self.metrics.log_dropped.inc)
        stats = RunStats()
        delay, committed = RESTART_BACKOFF_S[0], 0
        try:
            while True:
                try:
                    return await self._session(dedup, pool, stats)
                except TransactionFailed as exc:
                    # Again and again without a batch committed (a broker that refuses
                    # transactions): wait longer each time, up to the longest backoff.
                    if stats.batches > committed:
                        delay, committed = RESTART_BACKOFF_S[0], stats.batches
                    log.warning("%s; starting over from the last commit in %.0f s: the index "
                                "reopened and restored, the group joined again", exc, delay)
                    await asyncio.to_thread(dedup.reopen)
                    await pause(self.stop, delay)
                    delay = min(delay * 2, RESTART_BACKOFF_S[1])
                    if self.stop.is_set():
                        return 0
        finally:
            if pool is not None:
                pool.shutdown()
            await asyncio.to_thread(dedup.close)
            log.info("stopped after %d records in %d batches (all committed%s); decisions: "
                     "%s; skipped (not pages): %s", stats.records, stats.batches,
                     f"; {stats.abandoned} records of the batch in flight were not, and will "
                     "be delivered again" if stats.abandoned else "", stats.decisions,
                     stats.skipped)

    async def _session(self, dedup: Deduplicator, pool: AnalysisPool | None,
                       stats: RunStats) -> int:
        """Connect, consume and decide until a stop; the exit code. --exactly-once: a
        transaction that failed raises TransactionFailed once the clients are closed."""
        settings, stop, m = self.settings, self.stop, self.metrics
        consumer = self.consumer = make_consumer(settings, lambda: m.kafka_error("metadata"))
        producers: Producers | None = None

        async def new_producer() -> AIOKafkaProducer:
            """Made once the broker's limits are known: its batches stay within the smallest
            output topic's max.message.bytes (the broker holds a whole batch to it)."""
            batch = sink.limits.batch(self._output_topics())
            fresh = make_producer(settings, lambda: m.kafka_error("metadata"), batch)
            await retry("connecting the producer", lambda: within_grace(fresh.start(), stop),
                        stop, lambda _: m.kafka_error("connect"), settings)
            if batch < DEFAULT_BATCH:
                log.info("producer batches of at most %d bytes (the smallest output topic "
                         "limit)", batch)
            return fresh

        source: KafkaSource
        sink: KafkaSink
        if settings.exactly_once:
            producers = Producers(settings, m, DEFAULT_BATCH)
            restore = None if dedup.journal is None else (
                lambda keep_alive: restore_index(settings, dedup, m, stop, keep_alive))
            source = TransactionalSource(settings, consumer, dedup.index, m, producers, stop,
                                         restore)
            sink = TransactionalSink(settings, m, producers, dedup.journal is not None,
                                     self.faults)
        else:
            source = KafkaSource(settings, consumer, dedup.index, m)
            sink = KafkaSink(settings, None, m, new_producer=new_producer)
        runner = self.runner = Runner(
            settings, dedup, source, sink, pool, m, faults=self.faults, stats=stats)
        security = kafka_security(settings)
        log.info("stream-dedup serve: %s -> decisions %s, kept %s, dead letters %s (group %s, "
                 "broker %s, %s, %d worker(s)%s)", settings.input_topic,
                 settings.decisions_topic, settings.kept_topic or "(off)",
                 settings.dead_letter_topic, settings.group_id, settings.bootstrap_servers,
                 security.describe(), settings.workers,
                 ", exactly-once" if settings.exactly_once else "")
        if security.protocol == "SASL_PLAINTEXT" and security.mechanism == "PLAIN":
            log.warning("SASL PLAIN over SASL_PLAINTEXT: the password crosses the network "
                        "unencrypted (SASL_SSL encrypts it)")
        try:
            # A stop cuts a start short: a hung broker can hold one for 40 s.
            await retry(f"connecting the consumer to {settings.bootstrap_servers}",
                        lambda: within_grace(consumer.start(), stop), stop,
                        lambda _: m.kafka_error("connect"), settings)
            # Topics before the subscription: a topic the consumer asks for first is made
            # by the broker's auto-creation, if at all, after an ERROR in the log.
            # Each admin request ends within the stop's grace (a broker that hangs).
            await within_grace(ensure_topics(
                settings, [settings.input_topic, *self._output_topics()],
                compacted=[settings.changelog()] if dedup.journal is not None else []), stop)
            if dedup.journal is not None:
                await within_grace(check_changelog(settings), stop)
            sink.limits = await within_grace(read_limits(settings, self._output_topics()),
                                             stop)
            self._warn_about_limits(sink.limits)
            if producers is not None:
                producers.max_batch = sink.limits.batch(
                    [*self._output_topics(), settings.changelog()])
                # The bulk before joining the group; what the partitions' earlier owners
                # still commit is read once they are fenced (TransactionalSource)
                await restore_index(settings, dedup, m, stop)
            else:
                sink.producer = await new_producer()
            consumer.subscribe([settings.input_topic], listener=source.listener)
            if stop.is_set():
                raise Abandoned("stopped while connecting")
            self.connected = True
            log.info("connected; consuming")
            await runner.run(stop)
        except Abandoned:
            log.info("stopped before the broker answered")
        except TransactionFailed:
            raise
        except (StreamDedupError, KafkaError) as exc:  # disk full, a non-retriable Kafka error
            log.error("stopping: %s (nothing after the last commit was committed)", exc)
            return 1
        except Exception:
            if not stop.is_set():
                log.exception("stopping on an unexpected error")
                return 1
        finally:
            self.connected = False
            # The consumer even if its start was cut short.
            clients = [c for c in (sink.producer, consumer) if c is not None]
            await asyncio.gather(*(stop_within(c, CLOSE_TIMEOUT_S) for c in clients))
            if producers is not None:
                await producers.close()
        return 0

    def _output_topics(self) -> list[str]:
        s = self.settings
        return [t for t in (s.decisions_topic, s.kept_topic, s.dead_letter_topic) if t]

    def _warn_about_limits(self, limits: Limits) -> None:
        """Say at start what the broker's limits mean for the largest pages accepted."""
        s = self.settings
        log.info("largest message the broker accepts: %d bytes (%s)", limits.broker,
                 ", ".join(f"{t}: {limits.of(t)}" for t in self._output_topics()))
        if s.kept_topic and s.max_page_bytes > limits.of(s.kept_topic):
            log.warning("max_page_bytes=%d is larger than the kept topic %s accepts (%d "
                        "bytes): a kept page above that goes to %s as a reference to its "
                        "input offset (header stream-dedup-ref), not as a copy; raise the "
                        "topic's max.message.bytes or lower --max-page-bytes", s.max_page_bytes,
                        s.kept_topic, limits.of(s.kept_topic), s.kept_topic)
        if s.max_page_bytes > limits.of(s.dead_letter_topic):
            log.warning("max_page_bytes=%d is larger than the dead-letter topic %s accepts "
                        "(%d bytes): a rejected record above that is sent truncated (header "
                        "stream-dedup-truncated)", s.max_page_bytes, s.dead_letter_topic,
                        limits.of(s.dead_letter_topic))

    async def probe_broker(self) -> Check:
        """Reachable = connected, and a metadata request answered within PROBE_TIMEOUT_S."""
        if self.consumer is None or not self.connected:
            return Check(False, f"not connected to {self.settings.bootstrap_servers} yet")
        try:
            await asyncio.wait_for(self.consumer.topics(), PROBE_TIMEOUT_S)
        except (TimeoutError, KafkaError, OSError) as exc:
            return Check(False, f"no metadata from {self.settings.bootstrap_servers} "
                         f"({type(exc).__name__})")
        return Check(True, self.settings.bootstrap_servers)

    def kafka_stats(self) -> dict[str, Any]:
        runner = self.runner
        lags = {f"{t}/{p}": n for (t, p), n in sorted(self.metrics.lags.items())}
        return {"kafka": {
            "connected": self.connected,
            "batches": runner.stats.batches if runner else 0,
            "records": runner.stats.records if runner else 0,
            "committed": runner.stats.committed if runner else 0,
            "skipped": dict(runner.stats.skipped) if runner else {},
            "consumer_lag": lags,
            "consumer_lag_total": sum(lags.values()),
        }}


async def push(settings: Settings, topic: str, paths: list[str], progress: bool = False,
               *, records: bool = False) -> SourceStats:
    """`replay --to-kafka`: captured pages into an input topic, as JSON page messages (or,
    with `records`, each WARC record as stored, for `--input-format warc`). What the
    readers saw (unreadable inputs included) is returned."""
    import base64
    import json

    from tqdm import tqdm

    from stream_dedup.models import Page
    from stream_dedup.sources.files import iter_inputs

    producer = make_producer(settings, lambda: None)
    stop = asyncio.Event()
    try:
        await retry(f"connecting to {settings.bootstrap_servers}", producer.start, stop,
                    settings=settings)
    except BaseException:
        await producer.stop()  # a refused start: closed, not left to the interpreter's exit
        raise
    sent = skipped = 0
    stats = SourceStats()
    if records:
        try:
            return await _push_records(producer, topic, paths, stats)
        finally:
            await producer.stop()
    try:
        acks = []
        for item in tqdm(iter_inputs(paths, stats), unit=" pages", disable=not progress):
            if not isinstance(item, Page):
                skipped += 1
                log.warning("not sent: %s (%s: %s)", item.source, item.kind, item.message)
                continue
            if item.revisit is not None:
                skipped += 1
                log.warning("not sent: %s (a WARC revisit record: the JSON page message has "
                            "no field for it; replay decides it)", item.source)
                continue
            message: dict[str, object] = {
                "url": item.url, "body_b64": base64.b64encode(item.body).decode(),
                       "headers": [list(h) for h in item.headers]}
            if item.fetched_at:
                message["fetched_at"] = item.fetched_at
            if item.status is not None:
                message["status"] = item.status
            acks.append(await producer.send(topic, json.dumps(message).encode(),
                                            key=item.url.encode()))
            sent += 1
            if len(acks) >= 1000:
                await asyncio.gather(*acks)
                acks = []
        await asyncio.gather(*acks)
    finally:
        await producer.stop()
    log.info("sent %d pages to %s (%d input records not sent)", sent, topic, skipped)
    return stats


async def _push_records(producer: Any, topic: str, paths: list[str], stats: SourceStats,
                        ) -> SourceStats:
    """Each record of each WARC file, as stored, one a message keyed by its target URI; a
    file that cannot be cut into records is named in `stats.unreadable`."""
    from stream_dedup.sources.fastwarc_reader import record_bytes

    sent = 0
    for path in paths:
        stats.files += 1
        acks = []
        try:
            for url, value in record_bytes(Path(path)):
                acks.append(await producer.send(topic, value, key=url and url.encode()))
                stats.records += 1
        except (ValueError, OSError) as exc:
            stats.unreadable.append(f"{path}: {exc}")
        await asyncio.gather(*acks)
        sent += len(acks)
    log.info("sent %d WARC records to %s, one a message", sent, topic)
    return stats
