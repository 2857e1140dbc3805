"""Offline replay: captured crawls (WARC, ARC, JSONL) through the runner `serve` uses.

FileSource (readers: Page | Rejected, in file order, in batches) -> Runner (decide, index
commit, retention) -> FileSink (one decision per input page, in input order; dead letters)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from stream_dedup.config import Settings
from stream_dedup.models import Decision
from stream_dedup.pipeline.deduplicator import AnalysisPool, Deduplicator
from stream_dedup.replay.units import UnitSource
from stream_dedup.runner.edges import Batch, PageRecords
from stream_dedup.runner.loop import Runner
from stream_dedup.sinks.files import FileSink, Writer
from stream_dedup.sources.files import iter_inputs
from stream_dedup.sources.stats import SourceStats
from stream_dedup.workers.cpus import allowed, pinned, placement

if TYPE_CHECKING:
    from stream_dedup.metrics import Metrics

log = logging.getLogger("stream_dedup")
# Inputs of at least this many bytes on disk start the analysis processes at once (they
# boot, ~0.4 s of another core, while this process reads the first units) and are read by
# them (replay/units.py); a smaller replay is read here and starts them only if a batch
# turns out to have MIN_POOL_PAGES pages to analyse (pipeline/analysis.py).
EARLY_START_BYTES = 16 << 20
UNSPLIT_WHY = ("one gzip stream, so it cannot be cut into parts (recompress it one gzip "
               "member per record, e.g. `warcio recompress IN OUT.warc.gz`)")


@dataclass
class ReplaySummary:
    pages: int = 0
    seconds: float = 0.0
    decisions: Counter[str] = field(default_factory=Counter)  # "keep/unique", "drop/near"...
    verification: Counter[str] = field(default_factory=Counter)
    skipped: dict[str, Any] = field(default_factory=dict)
    index: dict[str, float] = field(default_factory=dict)
    # this process's resident memory when the last batch was committed, the index still
    # held, and its peak so far (bytes; Linux /proc, else empty): what a machine is sized by
    memory: dict[str, int] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # "path: why", as rejected
    repeated: list[str] = field(default_factory=list)  # inputs given again, read once
    unsplit: list[str] = field(default_factory=list)  # big archives read whole: one gzip stream

    @property
    def pages_per_second(self) -> float:
        return self.pages / self.seconds if self.seconds > 0 else 0.0

    def count(self, decision: str, reason: str | None = None) -> int:
        return sum(
            n for key, n in self.decisions.items()
            if key.split("/")[0] == decision and (reason is None or key.split("/")[1] == reason)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "pages": self.pages,
            "kept": self.count("keep"),
            "dropped": self.count("drop"),
            "rejected": self.count("reject"),
            "decisions": dict(sorted(self.decisions.items())),
            "verification": dict(self.verification),
            "skipped_records": self.skipped,
            "seconds": round(self.seconds, 3),
            "pages_per_second": round(self.pages_per_second, 1),
            "index": self.index,
            "memory": self.memory,
            "unreadable_inputs": self.unreadable,
            "repeated_inputs": self.repeated,
            "unsplit_inputs": self.unsplit,
        }

    def render(self) -> str:
        lines = [
            f"pages      {self.pages:>10,}   ({self.pages_per_second:,.0f} pages/s, "
            f"{self.seconds:.1f} s)",
            f"kept       {self.count('keep'):>10,}",
            f"dropped    {self.count('drop'):>10,}",
            f"rejected   {self.count('reject'):>10,}",
            "by decision/reason:",
        ]
        lines += [f"  {key:<28} {n:>8,}" for key, n in sorted(self.decisions.items())]
        if self.verification:
            lines.append("verification: " + ", ".join(
                f"{k} {v:,}" for k, v in sorted(self.verification.items())))
        if self.memory:
            lines.append(f"memory: {self.memory['rss'] / 2**20:,.0f} MiB resident at the end, "
                         f"{self.memory['peak_rss'] / 2**20:,.0f} MiB at the peak "
                         f"({self.index.get('pages', 0):,.0f} pages held)")
        if self.skipped:
            lines.append("skipped records (not HTML pages): " + ", ".join(
                f"{k} {v:,}" for k, v in sorted(self.skipped.items()) if v))
        if self.repeated:
            lines.append("given more than once, read once: " + "; ".join(self.repeated))
        if self.unsplit:
            lines.append(f"read by one process, not shared by the --workers: {UNSPLIT_WHY}: "
                         + "; ".join(self.unsplit))
        if self.unreadable:
            lines.append(f"UNREADABLE INPUTS ({len(self.unreadable)}):")
            lines += [f"  {why}" for why in self.unreadable]
        return "\n".join(lines)


def replay(
    paths: Sequence[str | Path],
    sink: Writer,
    settings: Settings | None = None,
    *,
    dedup: Deduplicator | None = None,
    workers: int = 1,
    dead_letter: IO[str] | None = None,
    progress: bool = False,
    metrics: Metrics | None = None,
    pin: bool = True,
) -> ReplaySummary:
    """Decide every page of `paths` (in order) and write the decisions to `sink`, in
    batches of `settings.batch_size` through the runner `serve` uses. With `metrics`, also
    report latency and progress there (a `dedup` given along should have been made with
    `observer=metrics`). `pin`: with workers as many as the CPUs this process may use,
    each process on one of its own (workers/cpus.py)."""
    settings = settings or Settings()
    owned = dedup is None
    dedup = dedup or Deduplicator(settings, observer=metrics)
    summary = ReplaySummary()
    started = time.perf_counter()

    def delivered(decisions: Sequence[Decision]) -> None:
        shown.update(d.decision for d in decisions)
        if bar is None:
            return
        bar.update(len(decisions))
        bar.set_postfix(kept=shown["keep"], dropped=shown["drop"], rejected=shown["reject"],
                        refresh=False)

    pool = AnalysisPool(dedup.settings, workers) if workers > 1 else None
    source: FileSource | UnitSource = FileSource([Path(p) for p in paths],
                                                 namespace_field=dedup.settings.namespace_field)
    if pool is not None:
        size = _input_bytes(paths)
        if size >= EARLY_START_BYTES:
            # The processes read and analyse units of the input themselves (units.py);
            # until they are up, this process reads every unit.
            source = UnitSource([Path(p) for p in paths], dedup.analyzer, pool)
        else:
            log.info("replay of %.1f MB: the %d analysis worker process(es) start only for a "
                     "batch of enough pages (small inputs are analysed in this process)",
                     size / 1e6, pool.processes)
    shown: Counter[str] = Counter()
    runner = Runner(settings, dedup, source, FileSink(sink, dead_letter, delivered), pool,
                    metrics, inline=True)  # its loop serves nothing else (runner/loop.py)
    cpus = None
    if pool is not None and isinstance(source, UnitSource):
        cpus = placement(workers, allowed()) if pin else None
        if cpus is not None:
            pool.cpus = cpus[1:]
            log.info("one CPU each (--no-pin: the kernel places them): this process %d, "
                     "the workers %s", cpus[0], ", ".join(map(str, cpus[1:])))
        # Forked from this process before it starts any thread (the progress bar's, the
        # runner's), they have all it has loaded (from the forkserver: 0.37-0.50 s to the
        # first task); forked after what can be made before (the runner), they take the
        # first units while this process starts its event loop.
        pool.start(fork=True)
    # None without progress: even a disabled bar starts tqdm's monitor thread, which lives
    # on ~10 s, and a process with another thread does not fork its workers (workers/pool.py).
    bar = None
    if progress:
        from tqdm import tqdm  # 35 ms of imports a replay without a bar (-q) does not pay

        bar = tqdm(unit=" pages", dynamic_ncols=True, mininterval=0.5)
    try:
        with pinned(cpus[0] if cpus else None):
            asyncio.run(runner.run(asyncio.Event()))
        summary.index = dedup.index.stats()
        summary.memory = process_memory()
    finally:
        if bar is not None:
            bar.close()
        sink.close()
        if pool is not None:
            pool.shutdown()
        if owned:
            dedup.close()
    summary.seconds = time.perf_counter() - started
    summary.pages = runner.stats.records
    summary.decisions = Counter(runner.stats.decisions)
    summary.verification = Counter(dedup.counters.verify)
    summary.skipped = source.stats.skipped_summary()
    summary.unreadable = list(source.stats.unreadable)
    summary.repeated = list(source.stats.repeated)
    summary.unsplit = list(source.stats.unsplit)
    return summary


def process_memory() -> dict[str, int]:
    """This process's resident set now (`rss`) and at its peak (`peak_rss`), in bytes, from
    /proc/self/status (empty where there is none)."""
    names = {"VmRSS:": "rss", "VmHWM:": "peak_rss"}
    out = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key = line.split(None, 1)[0] if line.strip() else ""
                if key in names:
                    out[names[key]] = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return {}
    return out


def _input_bytes(paths: Sequence[str | Path]) -> int:
    total = 0
    for p in paths:
        try:
            total += os.stat(p).st_size
        except OSError:
            pass  # the source reports it
    return total


class FileSource(PageRecords):
    """The pages of `paths`, in order, in batches. A file is read once: nothing comes again
    (the same page twice is a duplicate, not a redelivery) and there is nothing to commit;
    archived fetch times are history, so latency counts from reading."""

    redelivers = False
    live = False
    reads_ahead = True

    def __init__(self, paths: Iterable[str | os.PathLike[str]],
                 stats: SourceStats | None = None, *, namespace_field: str = "") -> None:
        self.stats = stats if stats is not None else SourceStats()
        self._items = iter_inputs(paths, self.stats, namespace_field)

    async def fetch(self, max_records: int, stop: asyncio.Event) -> Batch | None:
        records = list(itertools.islice(self._items, max_records))
        return Batch(records) if records else None

    async def commit(self, batch: Batch, stop: asyncio.Event) -> None:
        pass
