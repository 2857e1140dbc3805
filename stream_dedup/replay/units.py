"""`replay --workers N` over files: the worker processes read and analyse, this process
decides. The replay source for inputs worth a pool (replay/run.py: EARLY_START_BYTES or more).

    this process                                      worker processes (AnalysisPool)
    the inputs -> units, in input order:
      an archive: parts of ~UNIT_BYTES cut at
      records (parts.py; one unit if it is one
      gzip stream); gzipped JSONL: one unit;
      plain JSONL: ranges of ~UNIT_BYTES cut at
      line ends (line numbers counted here)
    keeps 6 units (32 MB at most) a process ─────────> read the unit (files.py readers),
      submitted, the earliest not taken first          analyse its pages; send back the
    reads and analyses the earliest unit nobody        pages without their bodies, the
      has taken itself, while the one due is not       analyses, and the readers' counts
      back (it never idles while units wait)    <────
    settles an archive's parts in order (record
      ordinals; a cut that was no record start)
    hands out batches of items + analyses, in input order -> runner/loop.py -> the Deduplicator

Why: a page sent to a worker as a Page and its Analysis sent back cost this process ~60-80
µs a page, and reading (gunzip, WARC parsing, base64 of JSONL bodies) ~450 µs a corpus
page; both were in the one process whose core also decides, which held `--workers 2` to
1.0-1.1x. Here the unit's description goes out (a path and a range) and the bodies never
come back; what this process does per page a worker analysed is unpickling its analysis
and deciding it.

Decisions do not change: the same readers make the same pages (same `source`, same
rejects; an archive's parts read what the whole file's reader reads there, parts.py says
why), every analysis is `Analyzer.analyze` of the page, and the runner decides the items
in input order as it does any batch (Deduplicator.check_batch, `analysed`). A body
analysed before is not analysed again (its analysis is copied): the calling thread skips
exact copies of stored pages, and a worker should not do more. The processes also tell each
other which bodies they analyse (shared_fps.py), so that a copy is analysed in one of them.
A worker that dies breaks the pool: the units it held are read again (here, or by new
processes), so no page is lost and none comes twice.

This module schedules the units; unit_plan.py plans them, unit_feed.py gives them to the
workers, unit_read.py reads one (here or in a worker).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from stream_dedup.decide.verdicts import Analysis
from stream_dedup.models import Page, Rejected
from stream_dedup.pipeline.analysis import Analyzer
from stream_dedup.replay.parts import Chain, Cut
from stream_dedup.replay.unit_feed import (
    QUEUED_PER_PROCESS,
    Slot,
    Stopped,
    WorkerFeed,
)
from stream_dedup.replay.unit_memo import UnitMemo
from stream_dedup.replay.unit_plan import UNIT_BYTES, Unit, file_size, plan_units
from stream_dedup.replay.unit_read import (  # noqa: F401  (tests reach them here)
    Packed,
    UnitResult,
    finish_deferred,
    merge_stats,
    read_unit,
    unpack,
    with_sources,
    worker_read,
)
from stream_dedup.runner.edges import Batch, PageRecords
from stream_dedup.sources.stats import SourceStats
from stream_dedup.workers.shared_fps import SharedFingerprints

if TYPE_CHECKING:
    from stream_dedup.pipeline.analysis import AnalysisPool

# Units planned ahead of the one due (submitted, done here, or waiting), at most so many
# and so many bytes of input (at least one unit): their results wait in memory until
# decided. Enough that this process finds a unit to read while the one due is still being
# read by a worker: an archive can take a second there. (16 units: this process waited
# 0.31 s of a 1.05-1.10 s replay of the corpora with --workers 2; 64: 0.05 s of 0.88-1.02.)
AHEAD_UNITS = 64
AHEAD_BYTES = 64 << 20
# The input's last units, at most so many bytes of them: a batch begun then goes to be
# decided before this process reads another unit, so that deciding keeps up with reading
# and little is left to decide once the last unit is read.
ENDING_BYTES = 8 * UNIT_BYTES
ENDING_BATCH = 100  # ... and a batch is at most so many records



class _NotBack(Exception):
    """A batch begun goes out as it is: the unit due is a worker's and not back, and no
    other is read here meanwhile (none is left, or the input is ending)."""


class UnitSource(WorkerFeed, PageRecords):
    """FileSource's pages and rejects, in the same order, each page with its analysis
    (Batch.analyses), read and analysed by `pool`'s processes and this one (see the
    module's docstring). Without a ready pool every unit is read here."""

    redelivers = False
    live = False
    reads_ahead = True

    def __init__(self, paths: Iterable[str | os.PathLike[str]], analyzer: Analyzer,
                 pool: AnalysisPool | None, stats: SourceStats | None = None, *,
                 unit_bytes: int | None = None) -> None:
        self.stats = stats if stats is not None else SourceStats()
        self.analyzer = analyzer
        self.pool = pool
        super().__init__()
        self._plan = plan_units(paths, self.stats, unit_bytes or UNIT_BYTES)
        self._planned_all = False
        self._slots: deque[Slot] = deque()
        self._chain: Chain | None = None  # of the archive whose parts are due
        self._shared = UnitMemo(self._seen)  # the analyses remembered here
        self._current: UnitResult | None = None
        self._at = 0  # next item of _current
        self._stop: asyncio.Event | None = None  # the fetch's, while it runs
        self._reader: ThreadPoolExecutor | None = None  # the thread fetches run in
        self._wake: Future[None] | None = None  # ends _feeding in that thread
        self.units_here = 0  # units read in this process / by the workers (tests, logs)
        self.units_there = 0
        self.restarts = 0

    async def fetch(self, max_records: int, stop: asyncio.Event) -> Batch | None:
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="units")
        if self._wake is not None:  # the thread is keeping the workers fed: it stops
            self._wake.set_result(None)
            self._wake = None
        try:
            items, analyses = await asyncio.get_running_loop().run_in_executor(
                self._reader, self._take, max_records, stop)
        except asyncio.CancelledError:
            # Ctrl-C: asyncio.run cancels the run and then waits for this thread, which
            # would otherwise read on to the end of the input.
            stop.set()
            raise
        if not items:
            self._reader.shutdown(wait=False)
            self._reader = None
            return None
        if self._ending():
            self._wake = Future()
            self._reader.submit(self._feeding, self._wake)
        return Batch(items, analyses=analyses)

    async def commit(self, batch: Batch, stop: asyncio.Event) -> None:
        pass

    # --- in the fetching thread (one fetch at a time) ---------------------------------
    def _take(self, max_records: int, stop: asyncio.Event
              ) -> tuple[list[Page | Rejected], list[Analysis | None]]:
        items: list[Page | Rejected] = []
        analyses: list[Analysis | None] = []
        self._stop = stop  # a unit read or awaited is left at once when the replay stops
        if self._ending():
            max_records = min(max_records, ENDING_BATCH)
        while len(items) < max_records and not stop.is_set():
            if self._current is None or self._at >= len(self._current.items):
                try:
                    # A batch begun goes out rather than wait for a worker's unit (the end
                    # of the input): it is decided meanwhile, not after the last unit.
                    self._current, self._at = self._next_result(begun=bool(items)), 0
                except (Stopped, _NotBack):
                    self._current, self._at = None, 0
                    break
                if self._current is None:
                    break
                merge_stats(self.stats, self._current.stats)
            n = min(max_records - len(items), len(self._current.items) - self._at)
            items += self._current.items[self._at:self._at + n]
            analyses += self._current.analyses[self._at:self._at + n]
            self._at += n
        return items, analyses

    def _plan_ahead(self) -> None:
        """Plan more units ahead of the one due, up to AHEAD_UNITS and AHEAD_BYTES; a few
        at a time (finding a part costs ~0.1 ms): the first ones go to the workers while
        the rest is planned later."""
        ahead = sum(s.unit.size for s in self._slots if s.unit is not None)
        step = QUEUED_PER_PROCESS * (self.pool.processes if self.pool is not None else 0) + 2
        while step > 0 and not self._planned_all and len(self._slots) < AHEAD_UNITS and (
                not self._slots or ahead < AHEAD_BYTES):
            step -= 1
            planned = next(self._plan, None)
            if planned is None:
                self._planned_all = True
            elif isinstance(planned, Rejected):
                self.stats.unreadable.append(planned.message)
                self._slots.append(Slot(None, result=UnitResult([planned], [None])))
            else:
                self._slots.append(Slot(planned))
                ahead += planned.size

    def _ending(self) -> bool:
        """Whether the units left (planned, not collected) are the input's last few, and
        workers read some of them."""
        return self._planned_all and self.pool is not None and \
            self.pool.executor() is not None and sum(
            s.unit.size for s in self._slots if s.unit is not None) <= ENDING_BYTES

    def _next_result(self, begun: bool = False) -> UnitResult | None:
        """The next unit's result in input order: collected from a worker, or read here;
        while it is not back, this thread reads the earliest unit nobody has taken. With
        a batch `begun`, _NotBack instead of waiting for a worker's, and instead of reading
        one here over the input's last units (`_ending`)."""
        self._plan_ahead()
        while self._slots:
            head = self._slots[0]
            self._feed()
            if head.free:
                if begun and self._ending():
                    raise _NotBack
                head.result = self._here(head)
            elif head.result is None:
                assert head.task is not None
                executor, future = head.task
                if not future.done():
                    self._plan_ahead()
                    spare = None if begun and self._ending() else next(
                        (s for s in self._slots if s.free), None)
                    if spare is not None:
                        spare.result = self._here(spare)
                        continue
                    if begun:
                        raise _NotBack
                try:
                    head.result = executor.result(future, self._stopping)
                    self.units_there += 1
                except BrokenProcessPool:
                    self._lost(executor)
                    continue
                except TimeoutError:
                    raise Stopped from None
            self._slots.popleft()
            result = self._settled(head)
            self._bury()
            self._plan_ahead()
            self._feed()
            self._finish_pool()
            if result is not None:
                return result
        return None

    def _settled(self, slot: Slot) -> UnitResult | None:
        """The due unit's result, its sources set; None for an archive part dropped
        (parts.py Chain; what is read in its place or after it goes first in line)."""
        unit, got = slot.unit, slot.result
        assert got is not None
        if isinstance(got, UnitResult) and got.deferred:
            finish_deferred(got, self.analyzer, self._shared.memo)
        if unit is None or got.end is None:
            return self._shared.remembered(unpack(got, None, self._shared.recall)) \
                if isinstance(got, Packed) else got
        assert unit.fmt is not None
        if self._chain is None or self._chain.path != unit.path:
            self._chain = Chain(unit.path, unit.fmt)
        settled = self._chain.settle(Cut(unit.start, unit.end, unit.last), got.end,
                                     rest=unit.kind == "archive-rest")
        if settled.rest is not None:
            at, skip = settled.rest
            self._slots.appendleft(Slot(Unit(unit.path, unit.name, "archive-rest", at,
                                              size=max(file_size(unit.path) - at, 0),
                                              fmt=unit.fmt, skip=skip)))
        if settled.again is not None:
            self._slots.appendleft(Slot(dataclasses.replace(
                unit, start=settled.again, size=unit.end - settled.again)))
        if settled.base is None:
            return None
        sources = [f"{unit.name}#{settled.base + n}" for n in got.end.ordinals]
        if isinstance(got, Packed):
            return self._shared.remembered(unpack(got, sources, self._shared.recall))
        return with_sources(got, sources)

    def _seen(self) -> SharedFingerprints | None:
        return self.pool.seen if self.pool is not None else None

    def _bury(self) -> None:
        """Drop the forgotten analyses no unit still out may ask for."""
        self._shared.bury(min((s.sent for s in self._slots if s.task is not None),
                              default=None))

    def _here(self, slot: Slot) -> UnitResult:
        assert slot.unit is not None
        self.units_here += 1
        slot.here = True
        seen = self._seen()
        try:
            return read_unit(slot.unit, self.analyzer, self._shared.memo, tick=self._tick,
                             elsewhere=seen.in_worker if seen is not None else None,
                             analysing=self._shared.analysing)
        finally:
            slot.here = False
