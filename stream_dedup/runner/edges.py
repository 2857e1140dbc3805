"""The runner's edges: where records come from and where decisions go.

    Source ──fetch──> Batch ──> Runner: decide ──> Sink.deliver ──> index commit
       ^                                                                │
       └─────────────────────────── Source.commit(batch) <──────────────┘

A `Batch` holds a source's records in the order they are decided, the position after its
last record in each stream (what a commit stores, in the index too), and its plan (each
stream's range, which a persistent index keeps until the commit so that a restart can cut
the same batch again). Adapters: Kafka (kafka/edges.py), files for `replay`
(replay/run.py FileSource, sinks/files.py FileSink), and, for tests, the in-process edges below:
a list source, a list sink, and crash injection as data (`Faults`: the runner dies at a
named kill point, by raising `Crash` in a test, by exiting in a process-level test).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Coroutine, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from stream_dedup.decide.verdicts import Analysis
from stream_dedup.index.base import Change, FeatureIndex, Plan
from stream_dedup.models import Decision, Page, Rejected, Skipped

# before-transaction-commit: --exactly-once only, every output sent in the batch's
# transaction, the transaction not committed
KILL_POINTS = ("before-deliver", "before-transaction-commit", "before-index-commit",
               "before-source-commit")
CRASH_EXIT = 70  # the exit code of a process that a kill point ended
STOP_GRACE_S = 3.0  # after a stop, how long the batch in flight may still take to deliver
T = TypeVar("T")


class Abandoned(Exception):
    """A stop came while the batch in flight could not be finished: it stays uncommitted."""


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep, cut short by a stop."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


async def within_grace(work: Coroutine[Any, Any, T], stop: asyncio.Event) -> T:
    """Run `work`; once `stop` is set it has STOP_GRACE_S more, then it is cancelled and
    Abandoned is raised."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait({task}, timeout=STOP_GRACE_S)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise Abandoned("stopped while the outputs were not taken")
        return task.result()
    finally:
        stopping.cancel()


@dataclass
class Batch:
    records: list[Any]
    positions: dict[str, int] = field(default_factory=dict)  # stream -> next position
    plan: Plan = field(default_factory=list)  # (stream, first, end) in decide order
    received: float = field(default_factory=time.time)
    # The records' analyses, when the source made them (files read and analysed in worker
    # processes, replay/units.py): analyses[i] is records[i]'s (None: a reject, or none).
    analyses: list[Analysis | None] | None = None
    # The pages the batch kept, when the index keeps a changelog (Deduplicator.journal):
    # written in the batch's transaction (kafka/transactions.py)
    changes: list[Change] = field(default_factory=list)
    # Records that are not pages (Source.item said Skipped: a WARC request record...), by
    # kind: taken out of `records` before deciding; `positions` still cover them, so the
    # commit does too
    skipped: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, entries: Iterable[tuple[str, int, Any]], received: float | None = None, *,
           planned: bool = True) -> Batch:
        """A batch of (stream, position, record), in decide order; `planned=False`: no plan
        for the index to keep (a source whose restart resumes elsewhere)."""
        records: list[Any] = []
        spans: dict[str, list[int]] = {}
        for stream, position, record in entries:
            records.append(record)
            span = spans.setdefault(stream, [position, position + 1])
            span[0], span[1] = min(span[0], position), max(span[1], position + 1)
        return cls(records, {s: end for s, (_, end) in spans.items()},
                   [(s, first, end) for s, (first, end) in spans.items()] if planned else [],
                   time.time() if received is None else received)


class Source(Protocol):
    # A record not committed can come again (Kafka after a crash or a rebalance), and must
    # get the decision it got (the Deduplicator remembers decisions by position and body).
    # A source that never redelivers (files) says False: the runner then neither asks nor
    # fills that memory, so the same page read twice is a duplicate, not a redelivery.
    redelivers: bool
    # Its pages were fetched moments ago: decision latency counts from their fetched_at.
    live: bool
    # Its next batch may be fetched while one is decided (nothing to hold or commit in
    # between, nothing a rebalance takes: files): the runner then keeps an analysis pool busy.
    reads_ahead: bool

    async def fetch(self, max_records: int, stop: asyncio.Event) -> Batch | None:
        """The next batch (no records: nothing yet), or None when the source has ended."""
        ...

    def hold(self, batch: Batch) -> AbstractAsyncContextManager[Batch]:
        """While the runner decides, delivers and commits: the batch as it stands then
        (Kafka drops what a rebalance took meanwhile, and makes the next one wait)."""
        ...

    async def decided(self) -> None:
        """The batch held is decided; it is delivered and committed next. A source may read
        ahead now, without waiting (Kafka: takes what its consumer fetched, so that it
        fetches again while the batch is delivered)."""
        ...

    def item(self, record: Any) -> Page | Rejected | Skipped:
        """A record as a page, a reject, or a Skipped (not a page, not an error: it gets no
        decision, and is committed with its batch); never raises. Runs in the decide
        thread."""
        ...

    async def commit(self, batch: Batch, stop: asyncio.Event) -> None:
        """The batch is done: it is not to be delivered again."""
        ...


class Sink(Protocol):
    async def deliver(self, batch: Batch, items: Sequence[Page | Rejected],
                      decisions: Sequence[Decision], stop: asyncio.Event) -> None:
        """Return once every output of the batch is durable (acknowledged); raise if it
        cannot be."""
        ...


# --- crash injection ----------------------------------------------------------------------
class Crash(Exception):
    """The process dies here: nothing after this point happens."""


@dataclass(frozen=True, slots=True)
class Faults:
    """Die at kill point `point` (one of KILL_POINTS) of the `batch`-th batch this runner
    decides: raise Crash, or with `exit` (a process-level test) leave with CRASH_EXIT at
    once, as a crash would (no cleanup, nothing flushed). With `stall`, stop there that
    many seconds instead, the event loop blocked (a long GC pause, a stopped VM), and go
    on: heartbeats and transactions time out meanwhile."""

    point: str = ""
    batch: int = 1
    exit: bool = False
    stall: float = 0.0

    def __post_init__(self) -> None:
        if self.point and self.point not in KILL_POINTS:
            raise ValueError(f"kill point must be one of {', '.join(KILL_POINTS)}")

    def at(self, point: str, batch: int) -> None:
        if point == self.point and batch == self.batch:
            if self.stall:
                time.sleep(self.stall)
                return
            if self.exit:
                os._exit(CRASH_EXIT)
            raise Crash(f"{point} of batch {batch}")

    @classmethod
    def parse(cls, text: str, *, exit: bool = False) -> Faults:
        """POINT, POINT:BATCH or POINT:BATCH:STALL_SECONDS, e.g. before-source-commit:3."""
        point, batch, stall = (text.split(":") + ["", ""])[:3]
        return cls(point, int(batch or 1), exit and not stall, float(stall or 0))


class PageRecords:
    """For a source whose records are pages (or rejects) already and whose batches nothing
    else changes: a batch is held as it is, a record is its own item."""

    reads_ahead = False

    def hold(self, batch: Batch) -> AbstractAsyncContextManager[Batch]:
        return contextlib.nullcontext(batch)

    async def decided(self) -> None:
        pass

    def item(self, record: Any) -> Page | Rejected | Skipped:
        assert isinstance(record, Page | Rejected | Skipped)
        return record


# --- in-process edges (tests) ---------------------------------------------------------------
class ListSource(PageRecords):
    """Streams of pages in memory, named like partitions ("pages/0"). A fetch takes records
    stream by stream in `order`. Where a run starts: the offsets stored in `index` (a
    persistent one), else `committed` (kept by the test across a run and its restart, as a
    consumer group keeps them); a batch the index holds as in flight comes first, cut as
    planned."""

    redelivers = True
    live = True

    def __init__(self, streams: dict[str, Sequence[Page | Rejected | Skipped]],
                 committed: dict[str, int] | None = None, index: FeatureIndex | None = None,
                 order: Sequence[str] | None = None) -> None:
        self.streams = {name: [replace(item, source=f"{name}/{i}") for i, item in
                               enumerate(items)] for name, items in streams.items()}
        self.committed = {} if committed is None else committed
        stored = index.offsets() if index is not None else {}
        self.position = {name: stored.get(name, self.committed.get(name, 0))
                         for name in streams}
        self.plan = index.inflight() if index is not None else None
        self.order = list(order or streams)

    async def fetch(self, max_records: int, stop: asyncio.Event) -> Batch | None:
        if self.plan:
            picks, self.plan = [(s, range(first, end)) for s, first, end in self.plan], None
        else:
            picks = []
            for name in self.order:
                start = self.position[name]
                end = min(len(self.streams[name]), start + max_records)
                if end > start:
                    picks.append((name, range(start, end)))
                    max_records -= end - start
        if not picks:
            return None
        for name, span in picks:
            self.position[name] = max(self.position[name], span.stop)
        return Batch.of((name, i, self.streams[name][i]) for name, span in picks for i in span)

    async def commit(self, batch: Batch, stop: asyncio.Event) -> None:
        self.committed.update(batch.positions)


class ListSink:
    """Every decision and dead letter delivered, in lists (a test keeps one across a run
    and its restart, as a topic is kept). `crash_after`: raise Crash once that many
    decisions were delivered, in the middle of a batch."""

    def __init__(self, crash_after: int | None = None) -> None:
        self.decisions: list[Decision] = []
        self.dead_letters: list[Rejected] = []
        self.crash_after = crash_after

    async def deliver(self, batch: Batch, items: Sequence[Page | Rejected],
                      decisions: Sequence[Decision], stop: asyncio.Event) -> None:
        for item, decision in zip(items, decisions, strict=True):
            if self.crash_after is not None and len(self.decisions) >= self.crash_after:
                raise Crash(f"mid-deliver, after {self.crash_after} decisions")
            self.decisions.append(decision)
            if isinstance(item, Rejected):
                self.dead_letters.append(item)
