"""Keeping the workers of a `replay --workers N` fed (units.py schedules the units and
reads them in order; this is the part that gives them to the worker processes): the
units they hold, submitting the earliest free ones, noticing the ones back, letting the
workers go at the end, and a worker that died.
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stream_dedup.replay.unit_memo import UnitMemo
from stream_dedup.replay.unit_plan import Unit
from stream_dedup.replay.unit_read import Packed, UnitResult, worker_read
from stream_dedup.workers.pool import POLL_S

if TYPE_CHECKING:
    import asyncio

    from stream_dedup.pipeline.analysis import AnalysisPool
    from stream_dedup.workers.pool import WorkerPool

log = logging.getLogger("stream_dedup.replay")

# Units kept submitted per worker process. More than the two a batch's tasks keep
# (pipeline/analysis.py): a finished unit is noticed only when this process's result thread gets
# the GIL, which the thread analysing here holds for up to a switch interval (5 ms) at a
# time, and a unit of JSONL is ~7 ms of a worker's work.
# 6 measured against 2 and 12: 1.76-1.91 s against 2.07-2.36 and 2.43-2.73 (synthetic).
QUEUED_PER_PROCESS = 6
# ... and at most this many bytes of input per process (at least one unit): a unit's result
# (its pages without bodies, their analyses: ~2-3 KB a page and 4 B a shingle) waits in this
# process until decided, and an archive that is one gzip stream is one unit however large
# (a 1 GB WARC: ~100,000 pages).
QUEUED_BYTES_PER_PROCESS = 32 << 20


class Stopped(Exception):
    """The replay is stopping: the unit being read or waited for is left unfinished."""


@dataclass(slots=True)
class Slot:
    unit: Unit | None  # None: `result` was ready when planned (an unreadable input)
    task: tuple[WorkerPool, Future[Packed]] | None = None
    result: UnitResult | Packed | None = None  # a worker's is unpacked when due
    here: bool = False  # being read in this process
    sent: int = 0  # its number among the units submitted (0: not submitted)

    @property
    def free(self) -> bool:
        """Nobody has taken it yet."""
        return self.unit is not None and self.task is None and self.result is None \
            and not self.here


class WorkerFeed:
    """The feeding half of units.UnitSource (its base): the slots of the units planned
    ahead, in input order, and what the workers were given of them."""

    pool: AnalysisPool | None
    units_there: int  # units collected from the workers (tests, logs)
    restarts: int
    _slots: deque[Slot]
    _shared: UnitMemo
    _planned_all: bool
    _stop: asyncio.Event | None

    def __init__(self) -> None:
        self._lost_pools: list[WorkerPool] = []  # the broken executors already handled
        # Units the workers have sent back (counted by their futures' callbacks) and the
        # executor, as of the last _feed: while neither changes, there is nothing to feed.
        self._backs = 0
        self._fed: tuple[int, WorkerPool | None] = (-1, None)

    def _feed(self) -> None:
        """Keep QUEUED_PER_PROCESS units per worker process submitted, earliest first."""
        executor = self.pool.executor() if self.pool is not None else None
        self._fed = (self._backs, executor)
        if executor is None:
            return
        assert self.pool is not None
        busy = self._held()
        running = len(busy)
        queued = sum(s.unit.size for s in busy if s.unit is not None)
        depth = QUEUED_PER_PROCESS * self.pool.processes
        budget = QUEUED_BYTES_PER_PROCESS * self.pool.processes
        for slot in self._slots:
            if running >= depth or (running and queued >= budget):
                break
            if slot.free:
                assert slot.unit is not None
                try:
                    slot.task = executor, executor.submit(worker_read, slot.unit)
                except (BrokenProcessPool, RuntimeError):  # broke, or shut down meanwhile
                    self._lost(executor)
                    return
                slot.task[1].add_done_callback(self._back)
                self._shared.sent += 1
                slot.sent = self._shared.sent
                running += 1
                queued += slot.unit.size

    def _held(self) -> list[Slot]:
        """The units the workers hold: sent and not back. (One back but not collected yet
        is not held: the thread that collects it may be reading a unit here meanwhile, and
        the workers would wait for it.)"""
        return [s for s in self._slots
                if s.task is not None and s.result is None and not s.task[1].done()]

    def _feeding(self, wake: Future[None]) -> None:
        """Between fetches over the input's last units (small ones, parts.py): give the
        workers the next units as they finish theirs, until `wake` (the next fetch) or
        POLL_S without one back. Otherwise nothing would while the batch is decided."""
        while not wake.done() and not self._stopping():
            out: list[Future[Any]] = [s.task[1] for s in self._held() if s.task is not None]
            if not out or not wait([*out, wake], POLL_S, FIRST_COMPLETED).done:
                return
            self._feed()

    def _finish_pool(self) -> None:
        """Once every unit is planned and none is left for the workers, let them exit now
        (AnalysisPool.finish): their exit then overlaps this process deciding the last
        batches instead of following them (~7 ms). A unit planned after all (an archive
        part read again, parts.py) is read here."""
        if self.pool is not None and self.pool.executor() is not None and self._planned_all \
                and not self._held() and not any(s.free for s in self._slots):
            self.pool.finish()

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _tick(self) -> None:
        """After each page read here: keep the workers fed (only if a unit came back or the
        workers became ready since the last feed: _feed after every page cost ~3 % of
        `--workers 2` on the synthetic crawl against feeding after every 16th, 6 rounds);
        stop if the replay stops."""
        if self._stopping():
            raise Stopped
        if self._fed != (self._backs, self.pool.executor() if self.pool is not None else None):
            self._feed()

    def _back(self, _: Future[Packed]) -> None:
        """A unit came back (in the pool's thread; a count lost to a race only delays the
        feed to the next unit back or to the next unit due)."""
        self._backs += 1

    def _lost(self, executor: WorkerPool) -> None:
        """A worker died: its pool is forgotten, new processes start in the background, and
        every unit the old ones held and did not send back is read again (here meanwhile)."""
        assert self.pool is not None
        if any(e is executor for e in self._lost_pools):
            return
        self._lost_pools.append(executor)
        lost = 0
        for slot in self._slots:
            if slot.task is not None and slot.task[0] is executor and slot.result is None:
                future = slot.task[1]
                if future.done() and not future.cancelled() and future.exception() is None:
                    slot.result = future.result()
                    self.units_there += 1
                else:
                    slot.task = None
                    lost += 1
        log.error("a worker process died while reading the input; %d unit(s) it held are "
                  "read again; starting new workers", lost)
        self.restarts += 1
        self.pool.broken(executor)
        self.pool.start()
