"""The pure stages of a page (`Analyzer`), and the processes that run them (`AnalysisPool`).

    deciding thread                                 worker processes (AnalysisPool)
    batch's bodies -> tasks (~CHUNK_BYTES each)
      keeps 2 tasks per process submitted, ───────>  take the tasks from the back
      from the back                                  (a page goes out whole; its analysis
      analyses tasks 0, 1, ... itself until the      comes back without it: fingerprints,
      two ends meet  <──────────────────────────────  sketch, features, LD signature)
    ordered decide step (pipeline/deduplicator.py)

No task is sent that this thread might also take (nothing to cancel: a process pool that
breaks fails on a cancelled future), the workers always have the next task queued, and the
deciding thread never idles while tasks wait, nor waits for a worker that is not up yet:
the processes start in the background (`start`), and until they are ready every batch is
analysed in the calling thread. A pool is bound to the Settings it was built with;
`Deduplicator.check_batch` refuses one built with others (their analyses would decide
differently) and anything that is not an AnalysisPool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from time import perf_counter

import numpy as np
import xxhash

from stream_dedup.config import Settings
from stream_dedup.core.canonical import canonicalize, kernels
from stream_dedup.core.sketch import Sketcher
from stream_dedup.core.tokens import Tokens, adopt_tables, tables
from stream_dedup.decide.verdicts import Analysis
from stream_dedup.errors import PageError
from stream_dedup.models import Page
from stream_dedup.workers.pool import WorkerPool, can_fork, start_forkserver
from stream_dedup.workers.pool import pool as worker_pool
from stream_dedup.workers.shared_fps import SharedFingerprints

log = logging.getLogger("stream_dedup")

# A batch with fewer bodies to analyse than this does not start the processes (their start,
# ~0.3 s of another core, is worth it only for more); an already started pool is used for
# any batch of 2 bodies or more.
MIN_POOL_PAGES = 200
# What one task carries: pages up to this many body bytes (or CHUNK_PAGES pages). Small
# enough that the calling thread and the workers meet near the middle of a batch, large
# enough that a task's fixed cost (a future, two pickles, a pipe round trip) stays small.
CHUNK_BYTES = 512 * 1024
CHUNK_PAGES = 32
# Tasks kept submitted per process: one running, the next already queued, so that a worker
# does not wait for the parent's threads (which share the GIL with reading and deciding).
QUEUED_PER_PROCESS = 2


def raw_fingerprint(body: bytes) -> int:
    return xxhash.xxh3_64_intdigest(body)


def canonical_fingerprint(tokens: Tokens) -> int:
    """xxh3 of the canonical text's UTF-32 code units (read in place, not copied)."""
    return xxhash.xxh3_64_intdigest(tokens.codepoints.data)


class Analyzer:
    """The pure part: bytes to fingerprints, sketch and features. No index, no I/O."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # Band keys serve only the near-verified tier: none stored without it.
        bands = settings.bands if settings.verify_single_feature else 0
        # Containment is measured on the shingle sets: no keys without them.
        contain = (settings.contain_keys, settings.contain_query_keys) \
            if settings.contains_on else (0, 0)
        self.sketcher = Sketcher(settings.params, (bands, settings.band_size),
                                 sets=settings.verify_exact, contain=contain,
                                 deep=settings.deep_asked)
        if kernels() != "compiled":
            log.warning("pure stages run on %s code (the C extension stream_dedup.core._native "
                        "was not built or not bound): same decisions, several times slower; "
                        "reinstall with a C compiler present", kernels())

    def analyze(self, page: Page) -> Analysis:
        """All pure stages for one page (what a worker process runs)."""
        a, tokens = self.canonical(page)
        return a if tokens is None else self.finish(a, tokens)

    def canonical(self, page: Page) -> tuple[Analysis, Tokens | None]:
        """Fingerprints and canonical tokens; tokens is None when the page is rejected."""
        started = perf_counter()
        raw_fp = raw_fingerprint(page.body)
        if page.revisit is not None:  # no payload: decided by the version it refers to
            return Analysis(page, raw_fp), None
        limit = self.settings.max_page_bytes
        if len(page.body) > limit:
            err = PageError("too-large", f"{len(page.body)} bytes > max_page_bytes={limit}")
            return Analysis(page, raw_fp, error=err, canonical_s=perf_counter() - started), None
        try:
            tokens = canonicalize(
                page.body, page.header("content-type"), boilerplate=self.settings.boilerplate
            )
        except PageError as err:
            return Analysis(page, raw_fp, error=err, canonical_s=perf_counter() - started), None
        except Exception as exc:  # a parser bug must reject one page, not stop the stream
            bug = PageError("parse-error", repr(exc))
            return Analysis(page, raw_fp, error=bug, canonical_s=perf_counter() - started), None
        a = Analysis(
            page,
            raw_fp,
            canonical_fingerprint(tokens),
            text_length=int(tokens.codepoints.shape[0]),
            shingle_count=max(0, len(tokens) - self.settings.shingle_words + 1),
            canonical_s=perf_counter() - started,
        )
        return a, tokens

    def finish(self, a: Analysis, tokens: Tokens) -> Analysis:
        """Sketch, features and LD signature (skipped for short pages)."""
        if a.shingle_count < self.settings.min_shingles:
            return a
        started = perf_counter()
        sk, keys, sig, tops = self.sketcher.page(tokens.hashes, tokens.codepoints)
        # Built directly: dataclasses.replace costs several µs a page.
        return Analysis(a.page, a.raw_fp, a.canonical_fp, a.text_length, a.shingle_count, sk,
                        keys, sig, None, a.canonical_s, perf_counter() - started,
                        shingles=tops)


_WORKER: Analyzer | None = None
_NO_PAGE = Page(url="", body=b"")


_SEEN: SharedFingerprints | None = None


def _worker_init(settings: Settings, tables: tuple[str, np.ndarray, np.ndarray, np.ndarray],
                 seen: SharedFingerprints | None = None) -> None:
    global _WORKER, _SEEN
    adopt_tables(*tables)
    _WORKER = Analyzer(settings)
    if seen is not None:
        seen.claim()
        _SEEN = seen


def worker_seen() -> SharedFingerprints | None:
    """Where this worker process says which bodies it reads (a forked pool's; else None)."""
    return _SEEN


def worker_analyzer() -> Analyzer:
    """The Analyzer of this worker process (only in an AnalysisPool's processes)."""
    if _WORKER is None:
        raise RuntimeError("only an AnalysisPool's worker processes have a worker Analyzer")
    return _WORKER


def _worker_ready() -> None:
    """A no-op task: submitting one per process starts them all."""


def _worker_analyze(pages: list[Page]) -> list[Analysis]:
    """The analyses without their pages: the caller still has them, and a body (tens of KB)
    need not be pickled back across the process boundary."""
    if _WORKER is None:
        raise RuntimeError("only an AnalysisPool's worker processes run _worker_analyze")
    return [replace(_WORKER.analyze(page), page=_NO_PAGE) for page in pages]


def chunks(pages: Sequence[Page]) -> list[list[Page]]:
    """`pages` in order, cut into tasks of about CHUNK_BYTES (at most CHUNK_PAGES pages)."""
    out: list[list[Page]] = []
    current: list[Page] = []
    size = 0
    for page in pages:
        if current and (size + len(page.body) > CHUNK_BYTES or len(current) >= CHUNK_PAGES):
            out.append(current)
            current, size = [], 0
        current.append(page)
        size += len(page.body)
    if current:
        out.append(current)
    return out


class AnalysisPool:
    """Analysis on `workers` cores: the calling thread and `workers - 1` processes (on two
    cores, the deciding thread and one worker; a second worker process would only take
    turns with the first on the core the caller also needs for reading and deciding).

    The processes ignore SIGINT and SIGTERM (the caller decides when to stop) and exit when
    the caller dies (workers/pool.py). They start at `start()`, or at the first batch of at
    least MIN_POOL_PAGES bodies, in the background. A worker that dies breaks the pool
    under its batch: that batch raises BrokenProcessPool (the runner decides it in its own
    thread), and the next batch starts new processes.

    >>> with AnalysisPool(Settings(), workers=2) as pool:  # doctest: +SKIP
    ...     Deduplicator(Settings()).check_batch(pages, pool)
    """

    def __init__(self, settings: Settings, workers: int) -> None:
        if not isinstance(settings, Settings):
            raise TypeError(f"AnalysisPool(settings, workers): settings must be Settings, not "
                            f"{type(settings).__name__}")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 2:
            raise ValueError(f"an AnalysisPool needs workers >= 2, got {workers!r} (with one, "
                             "pass no pool: the calling thread analyses)")
        self.settings = settings
        self.workers = workers
        self.processes = workers - 1
        self._lock = threading.Lock()
        self._starting: threading.Thread | None = None
        self._executor: WorkerPool | None = None
        self._ready = threading.Event()
        self._closed = False
        self.starts = 0  # process pools started (1 + replacements of broken ones)
        self._finished: WorkerPool | None = None  # told to exit (finish), not waited for
        # The bodies forked workers read (replay/units.py); None from the forkserver.
        self.seen: SharedFingerprints | None = None
        self.cpus: list[int] = []  # a CPU for each worker process, if so placed (workers/cpus.py)

    # --- lifecycle ----------------------------------------------------------------------
    def start(self, *, fork: bool = False) -> None:
        """Start the worker processes (returns at once; idempotent): with `fork`, forked
        from this process if it runs no other thread yet (milliseconds: replay, before its
        event loop; they have what this process has loaded and take tasks at once), else
        in the background from the forkserver (workers/pool.py)."""
        with self._lock:
            if self._closed or self._starting is not None or self._executor is not None:
                return
            if fork and not can_fork():
                log.info("other threads run (%s): the analysis worker processes start from "
                         "the forkserver", ", ".join(t.name for t in threading.enumerate()))
            elif fork:
                try:
                    seen = SharedFingerprints(self.processes)
                    self._executor = worker_pool(self.processes, _worker_init,
                                                 (self.settings, tables(), seen), fork=True)
                    self._executor.pin(self.cpus)
                    self.seen = seen
                    self.starts += 1
                    self._ready.set()
                    return
                except Exception:
                    log.exception("forking the analysis worker processes failed; starting "
                                  "them from the forkserver")
            self._starting = threading.Thread(target=self._start, name="analysis-pool-start",
                                              daemon=True)
            self._starting.start()

    def _start(self) -> None:
        """Start the processes from the forkserver; wait until they take tasks."""
        started = perf_counter()
        executor = None
        try:
            start_forkserver()  # it imports the package while this thread builds tables
            # The parent's tables go along (it needs them too): a worker that built its
            # own would spend ~0.4 s on them before its first page.
            executor = worker_pool(self.processes, _worker_init, (self.settings, tables()))
            executor.pin(self.cpus)
            # In the background: the first start of a forkserver imports the package there.
            for ready in [executor.submit(_worker_ready) for _ in range(self.processes)]:
                executor.result(ready)
        except Exception:
            log.exception("the analysis worker processes did not start (one killed while "
                          "starting?); analysing in the deciding thread, trying again with "
                          "the next batch")
            if executor is not None:  # its other processes exit now, not at garbage collection
                executor.shutdown(wait=False, cancel_futures=True)
            with self._lock:
                self._starting = None  # a later start() tries again
            return
        with self._lock:
            if self._closed:
                executor.shutdown(wait=False, cancel_futures=True)
                return
            self._executor = executor
            self.starts += 1
            self._ready.set()
        log.info("%d analysis worker process(es) ready in %.2f s", self.processes,
                 perf_counter() - started)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Start, and wait until the processes take tasks (forked ones: until forked;
        tests, benchmarks)."""
        self.start()
        return self._ready.wait(timeout)

    def finish(self) -> None:
        """No more tasks will come: the processes exit now, while the caller goes on
        (`shutdown` then waits for them). Until `shutdown`, `executor()` is None and
        `analyse` analyses in the calling thread."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
            self._ready.clear()
            if executor is not None:
                self._finished = executor
        if executor is not None:
            executor.shutdown(wait=False)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            starting, executor, self._executor = self._starting, self._executor, None
            self._ready.clear()
        if starting is not None:
            starting.join()
            with self._lock:
                executor, self._executor = executor or self._executor, None
        for done in (self._finished, executor):
            if done is not None:
                done.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> AnalysisPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def executor(self) -> WorkerPool | None:
        """The worker processes, once they take tasks (None before, or after a break)."""
        return self._executor if self._ready.is_set() else None

    def broken(self, executor: WorkerPool) -> None:
        """`executor` broke (BrokenProcessPool): forget it; `start()` starts new processes."""
        self._broken(executor)

    def _broken(self, executor: WorkerPool) -> None:
        """Forget a broken process pool; the next batch starts new processes."""
        with self._lock:
            if self._executor is executor:
                self._executor = None
                self._starting = None
                self._ready.clear()
                self.seen = None  # its workers' tables (new ones come from the forkserver)
        executor.shutdown(wait=False, cancel_futures=True)

    # --- work ---------------------------------------------------------------------------
    def analyse(self, analyzer: Analyzer, pages: list[Page]) -> list[Analysis]:
        """`analyzer.analyze` of every page, in order: the pages the processes do not take
        are analysed in this thread. Raises BrokenProcessPool if a worker died meanwhile."""
        if len(pages) >= MIN_POOL_PAGES:
            self.start()
        executor = self._executor if self._ready.is_set() else None
        if executor is None or len(pages) < 2:
            return [analyzer.analyze(p) for p in pages]
        tasks = chunks(pages)
        done: list[list[Analysis] | None] = [None] * len(tasks)
        running: dict[int, Future[list[Analysis]]] = {}
        depth = QUEUED_PER_PROCESS * self.processes
        low, high = 0, len(tasks)  # this thread takes tasks[low], the processes tasks[high - 1]
        here = 0
        started = perf_counter()
        try:
            while low < high:
                for k, f in list(running.items()):
                    if f.done():
                        done[k] = self._stripped(tasks[k], f.result())
                        del running[k]
                while len(running) < depth and high > low:
                    high -= 1
                    running[high] = executor.submit(_worker_analyze, tasks[high])
                if low < high:
                    done[low] = [analyzer.analyze(p) for p in tasks[low]]
                    low += 1
                    here += 1
            waiting = perf_counter()
            for k, f in running.items():
                done[k] = self._stripped(tasks[k], executor.result(f))
        except BrokenProcessPool:
            self._broken(executor)
            raise
        if log.isEnabledFor(logging.DEBUG):
            log.debug("analysed %d pages in %d tasks: %d here (%.3f s), %d by the workers "
                      "(waited %.3f s more)", len(pages), len(tasks), here,
                      waiting - started, len(tasks) - here, perf_counter() - waiting)
        return [a for task in done if task is not None for a in task]

    @staticmethod
    def _stripped(task: list[Page], analyses: list[Analysis]) -> list[Analysis]:
        """A worker's analyses, each given back its page (the worker sends none)."""
        return [replace(a, page=p) for p, a in zip(task, analyses, strict=True)]
