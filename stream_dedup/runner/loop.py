"""The delivery contract, one loop for `serve` and `replay`: batch -> decide -> deliver ->
index commit -> source commit. At-least-once.

For every batch a Source (runner/edges.py) fetches, in this order:
  1. fetch up to `batch_size` records; hold the batch (Kafka: only partitions still
     assigned, and a rebalance waits until step 5 is done, so partitions are handed over
     committed);
  2. in a worker thread (the event loop keeps fetching, heartbeating and answering HTTP):
     turn each record into a Page or a Rejected (bad input is a value, not an exception);
     write the batch's plan to the index (a persistent one keeps it until the commit, so a
     restart cuts the same batch again); decide the batch in order, the pure stages fanned
     out to the process pool;
  3. deliver every output to the Sink and wait until it says each is durable (Kafka: the
     broker acknowledged every send);
  4. commit the index: the pages kept and the batch's positions, atomically;
  5. commit the batch at the source (Kafka: the consumer group's offsets).
A crash anywhere before 5 means the batch comes again: outputs may repeat, nothing is lost;
with a persistent index a batch in it is not decided again (the source resumes at the
index's positions), and one not in it is decided against the same index state.

Faults, and what the runner does:
- a page whose deciding raises an unexpected error becomes an `internal-error` reject; a
  worker process that died (BrokenProcessPool) is replaced and the batch decided here;
- with an analysis pool, a source that reads ahead (files: nothing to hold or commit
  between batches) has its next batch read while this one is decided;
- the index unavailable (IndexUnavailable: a shared index's node down, or a page to wait
  for): nothing of the batch is delivered or committed; the same step is tried again with
  backoff (INDEX_BACKOFF_S), `index_ok` is False meanwhile (/readyz says so), one warning
  per INDEX_WARN_EVERY_S;
- any other StreamDedupError (an index that cannot be written) stops the runner;
- a stop (SIGTERM...) finishes the batch in flight if its outputs go through within
  STOP_GRACE_S, else abandons it uncommitted (it comes again); a stop while the index is
  unavailable abandons it at once.
Retention: a bounded expiry sweep once every EXPIRY_EVERY_S while running. `Faults` (crash
injection as data) makes the runner die at a kill point, for the tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from stream_dedup.config import Settings
from stream_dedup.decide.verdicts import Analysis
from stream_dedup.errors import IndexUnavailable, StreamDedupError
from stream_dedup.models import Decision, Page, Rejected, Skipped
from stream_dedup.pipeline.deduplicator import AnalysisPool, Deduplicator
from stream_dedup.runner.edges import (
    STOP_GRACE_S,
    Abandoned,
    Batch,
    Faults,
    Sink,
    Source,
    pause,
    within_grace,
)

if TYPE_CHECKING:
    from stream_dedup.metrics import Metrics

log = logging.getLogger("stream_dedup.runner")

EXPIRY_EVERY_S = 60.0
INDEX_BACKOFF_S = (0.1, 5.0)  # first and longest wait before asking an unavailable index again
INDEX_WARN_EVERY_S = 30.0
STEPS = ("decide", "deliver", "index-commit", "source-commit")  # of a batch, in order
T = TypeVar("T")


class Unobserved:
    """The runner's metrics when nobody reads them: none kept."""

    def batch_steps(self, steps: object, laps: object) -> None:
        pass

    def decided(self, items: object, received: float, done: float, *,
                since_fetch: bool = True) -> None:
        pass

    def progress(self) -> None:
        pass

    def skipped_records(self, kind: str, n: int) -> None:
        pass

    def refresh_index(self, dedup: Deduplicator) -> None:
        pass

    def index_error(self, operation: str) -> None:
        pass


@dataclass
class RunStats:
    batches: int = 0
    records: int = 0
    committed: int = 0
    abandoned: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)  # records not pages, by kind


class Runner:
    def __init__(
        self,
        settings: Settings,
        dedup: Deduplicator,
        source: Source,
        sink: Sink,
        pool: AnalysisPool | None = None,
        metrics: Metrics | None = None,
        faults: Faults | None = None,
        stats: RunStats | None = None,
        inline: bool = False,
    ) -> None:
        self.settings = settings
        self.dedup = dedup
        self.source = source
        self.sink = sink
        self.pool = pool
        # Nobody reads a replay's metrics without its HTTP port: then none are kept, and
        # prometheus_client is not imported (30 ms of start, a date parsed a page).
        self.metrics: Metrics | Unobserved = metrics if metrics is not None else Unobserved()
        self.faults = faults or Faults()
        self.stats = stats or RunStats()
        self.index_ok = True  # False while the index is unavailable (/readyz reports it)
        self.index_problem = ""
        self._next_warning = 0.0
        self._next_expiry = 0.0
        # Index steps (decide, commit, expiry) run in a thread of their own, so that the
        # event loop goes on serving the Kafka client meanwhile; with `inline` (replay: its
        # loop has nothing else to serve) in the loop's thread. A hand-off between the two
        # threads costs most where the kernel wakes the other on another CPU: inline,
        # `replay --workers 1` took 8 % less time on the 2-vCPU VM of bench/RESULTS.md (as
        # much as under taskset); `--workers 2`, whose threads share one CPU (workers/cpus.py), as
        # much as before.
        self.inline = inline
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="decide")

    async def run(self, stop: asyncio.Event) -> None:
        """Process batches until `stop` is set or the source ends; the batch in flight is
        finished (or abandoned uncommitted, see STOP_GRACE_S). A source that `reads_ahead`
        (files), with an analysis pool, is read one batch ahead: its next batch is read
        while this one is decided, so the worker processes are not idle meanwhile."""
        ahead = self.pool is not None and self.source.reads_ahead
        next_fetch: asyncio.Task[Batch | None] | None = None
        # A stop gives a batch waiting in the index for another instance STOP_GRACE_S, as
        # it gives its outputs; then the wait ends (the batch is abandoned, uncommitted).
        stopping = asyncio.ensure_future(stop.wait())
        later: list[asyncio.TimerHandle] = []
        stopping.add_done_callback(lambda f: None if f.cancelled() else later.append(
            asyncio.get_running_loop().call_later(STOP_GRACE_S, self.dedup.interrupt)))
        try:
            while not stop.is_set():
                await self._expire(stop)
                if next_fetch is not None:
                    fetched, next_fetch = await next_fetch, None
                else:
                    fetched = await self.source.fetch(self.settings.batch_size, stop)
                if fetched is None:
                    return
                if fetched.records:
                    if ahead:
                        next_fetch = asyncio.ensure_future(
                            self.source.fetch(self.settings.batch_size, stop))
                    async with self.source.hold(fetched) as batch:
                        if batch.records:
                            await self.process(batch, stop)
                else:  # idle: the index gauges may lag behind the last batch
                    await self._step(lambda: self.metrics.refresh_index(self.dedup))
        finally:
            stopping.cancel()
            for handle in later:
                handle.cancel()
            if stop.is_set():  # nothing waits on in the decide thread (shut down below)
                self.dedup.interrupt()
            if next_fetch is not None:  # read, never decided: it was not committed either
                next_fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await next_fetch
            self._thread.shutdown(wait=True)

    async def process(self, batch: Batch, stop: asyncio.Event) -> None:
        number = self.stats.batches + 1
        laps = [time.perf_counter()]  # the steps' ends (stream_dedup_batch_step_seconds)
        try:
            items, decisions = await self._index("decide", lambda: self._decide(batch), stop)
            laps.append(time.perf_counter())
            await self.source.decided()
            self.faults.at("before-deliver", number)
            await within_grace(self.sink.deliver(batch, items, decisions, stop), stop)
            delivered = time.time()
            laps.append(time.perf_counter())
            self.faults.at("before-index-commit", number)
            # The index (its pages and these positions, atomically) before the source's
            # commit: after a crash between the two, the source resumes at the index's.
            await self._index("commit", lambda: self.dedup.commit(batch.positions or None),
                              stop)
            laps.append(time.perf_counter())
            self.faults.at("before-source-commit", number)
            await within_grace(self.source.commit(batch, stop), stop)
            laps.append(time.perf_counter())
        except Abandoned as exc:
            size = len(batch.records) + sum(batch.skipped.values())
            log.warning("stopping (%s): a batch of %d records is not committed and will be "
                        "delivered again", exc, size)
            self.stats.abandoned += size
            return
        m = self.metrics
        m.batch_steps(STEPS, laps)
        m.decided(items, batch.received, delivered, since_fetch=self.source.live)
        m.progress()
        skipped = sum(batch.skipped.values())
        for kind, n in batch.skipped.items():
            m.skipped_records(kind, n)
            self.stats.skipped[kind] = self.stats.skipped.get(kind, 0) + n
        self.stats.batches += 1
        self.stats.records += len(batch.records) + skipped
        self.stats.committed += len(batch.records) + skipped
        for d in decisions:
            key = f"{d.decision}/{d.reason}"
            self.stats.decisions[key] = self.stats.decisions.get(key, 0) + 1

    async def _index(self, operation: str, step: Callable[[], T], stop: asyncio.Event) -> T:
        """Run an index step in the decide thread (`inline`: in this one); while the index is
        unavailable, the same step again after a backoff, until it answers or a stop
        abandons the batch."""
        delay = INDEX_BACKOFF_S[0]
        while True:
            try:
                result = await self._step(step)
            except IndexUnavailable as exc:
                self.metrics.index_error(operation)
                self.index_ok, self.index_problem = False, f"{operation}: {exc}"
                if time.monotonic() >= self._next_warning:
                    self._next_warning = time.monotonic() + INDEX_WARN_EVERY_S
                    log.warning("the index is unavailable (%s: %s); nothing of this batch is "
                                "delivered or committed; trying again with backoff (this "
                                "warning at most every %.0f s)", operation, exc,
                                INDEX_WARN_EVERY_S)
                await pause(stop, delay)
                if stop.is_set():
                    raise Abandoned("the index was unavailable") from exc
                delay = min(delay * 2, INDEX_BACKOFF_S[1])
                continue
            if not self.index_ok:
                log.info("the index answers again")
                self.index_ok, self.index_problem, self._next_warning = True, "", 0.0
            return result

    async def _step(self, step: Callable[[], T]) -> T:
        if not self.inline:
            return await asyncio.get_running_loop().run_in_executor(self._thread, step)
        await asyncio.sleep(0)  # a fetch reading ahead (run()) begins first
        return step()

    async def _expire(self, stop: asyncio.Event) -> None:
        """The retention window, applied while running, once a minute: the pages of every
        namespace crawled (or kept) before it are forgotten (memory and LSM; a Redis
        index's keys expire by themselves), journaled as any forget (exactly-once)."""
        days = self.settings.retention_days
        if days <= 0 or time.monotonic() < self._next_expiry:
            return
        self._next_expiry = time.monotonic() + EXPIRY_EVERY_S
        cutoff = datetime.now(UTC) - timedelta(days=days)
        try:
            removed = await self._index("expire", lambda: self.dedup.expire(cutoff), stop)
        except Abandoned:
            return
        if removed:
            log.info("retention: forgot %d pages crawled before %s", removed, cutoff.isoformat())

    def _decide(self, batch: Batch) -> tuple[list[Page | Rejected], list[Decision]]:
        """Records -> pages -> decisions, in the decide thread (decoding the records, about
        a tenth of the work, stays off the event loop too). Records that are not pages
        (Skipped) leave `batch.records` here, counted in `batch.skipped`: they get no
        decision and no output, and the batch's positions, which cover them, are
        committed as usual (a batch of nothing else delivers nothing and commits)."""
        converted = [self.source.item(record) for record in batch.records]
        items: list[Page | Rejected] = []
        if any(isinstance(item, Skipped) for item in converted):
            records = []
            for record, item in zip(batch.records, converted, strict=True):
                if isinstance(item, Skipped):
                    batch.skipped[item.kind] = batch.skipped.get(item.kind, 0) + 1
                else:
                    records.append(record)
                    items.append(item)
            batch.records = records
        else:
            items = converted  # type: ignore[assignment]  # no Skipped among them
        if batch.plan:
            self.dedup.begin(batch.plan)
        decisions = self._check(items, batch.analyses)
        batch.changes = self.dedup.take_journal()
        return items, decisions

    def _check(self, items: list[Page | Rejected],
               analysed: list[Analysis | None] | None = None) -> list[Decision]:
        """check_batch; if it raises, the pages one at a time, and a page that raises is an
        `internal-error` reject (it replaces the page in `items`). `analysed`: the batch's
        analyses, if its source made them (Batch.analyses)."""
        try:
            return self.dedup.check_batch(items, self.pool,
                                          redeliveries=self.source.redelivers,
                                          analysed=analysed)
        except StreamDedupError:
            raise  # the index cannot answer, or cannot be written: not one page's fault
        except BrokenProcessPool:
            log.error("a worker process died while analysing a batch of %d; starting new "
                      "workers, and deciding this batch in this process", len(items))
            if self.pool is not None:
                self.pool.start()  # the broken processes are gone (AnalysisPool.analyse)
        except Exception:
            log.exception("deciding a batch of %d raised; deciding its pages one at a time",
                          len(items))
        decisions = []
        for i, item in enumerate(items):
            try:
                decisions.append(self.dedup.reject(item) if isinstance(item, Rejected)
                                 else self.dedup.check_batch(
                                     [item], redeliveries=self.source.redelivers,
                                     analysed=None if analysed is None else [analysed[i]])[0])
            except StreamDedupError:
                raise
            except Exception as exc:
                log.exception("%s: deciding this page raised; it becomes an internal-error "
                              "reject", item.source)
                items[i] = Rejected(item.url, "internal-error",
                                    f"deciding raised {type(exc).__name__}: {exc}"[:1000],
                                    item.source, getattr(item, "body", None), item.carried)
                decisions.append(self.dedup.reject(items[i]))
        return decisions

