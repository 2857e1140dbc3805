"""Offline replay: captured crawls (WARC, ARC, JSONL) through the production pipeline.

files -> readers (Page | Rejected, in file order) -> batches -> Deduplicator.check_batch
      -> decisions sink (one line per input page, input order) + optional dead-letter file
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from .config import Settings
from .metrics import Metrics
from .models import Decision, Page, Rejected
from .pipeline import Deduplicator, analysis_pool
from .sinks import Sink, dead_letter_record
from .sources.files import iter_inputs
from .sources.warc import SourceStats

BATCH = 256


@dataclass
class ReplaySummary:
    pages: int = 0
    seconds: float = 0.0
    decisions: Counter[str] = field(default_factory=Counter)  # "keep/unique", "drop/near"...
    verification: Counter[str] = field(default_factory=Counter)
    skipped: dict[str, Any] = field(default_factory=dict)
    index: dict[str, float] = field(default_factory=dict)

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
        if self.skipped:
            lines.append("skipped records (not HTML pages): " + ", ".join(
                f"{k} {v:,}" for k, v in sorted(self.skipped.items()) if v))
        return "\n".join(lines)


def _batches(items: Iterable[Page | Rejected], size: int) -> Iterator[list[Page | Rejected]]:
    batch: list[Page | Rejected] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def replay(
    paths: Sequence[str | Path],
    sink: Sink,
    settings: Settings | None = None,
    *,
    dedup: Deduplicator | None = None,
    workers: int = 1,
    dead_letter: IO[str] | None = None,
    progress: bool = False,
    metrics: Metrics | None = None,
) -> ReplaySummary:
    """Decide every page of `paths` (in order) and write the decisions to `sink`. With
    `metrics`, also report latency and progress there (a `dedup` given along should have
    been made with `observer=metrics`)."""
    settings = settings or Settings()
    owned = dedup is None
    dedup = dedup or Deduplicator(settings, observer=metrics)
    stats = SourceStats()
    summary = ReplaySummary()
    started = time.perf_counter()
    pool = analysis_pool(settings, workers) if workers > 1 else None
    bar = tqdm(unit=" pages", disable=not progress, dynamic_ncols=True, mininterval=0.5)
    try:
        for batch in _batches(iter_inputs([Path(p) for p in paths], stats), BATCH):
            received = time.time()
            decisions: list[Decision] = dedup.check_batch(batch, pool)
            for item, decision in zip(batch, decisions, strict=True):
                sink.write(decision)
                summary.decisions[f"{decision.decision}/{decision.reason}"] += 1
                if dead_letter is not None and isinstance(item, Rejected):
                    dead_letter.write(dead_letter_record(item) + "\n")
            dedup.commit()  # a persistent index holds every batch that was written out
            if metrics is not None:  # archived fetch times are history: count from reading
                metrics.decided(batch, received, time.time(), since_fetch=False)
                metrics.progress()
            summary.pages += len(batch)
            bar.update(len(batch))
            bar.set_postfix(kept=summary.count("keep"), dropped=summary.count("drop"),
                            rejected=summary.count("reject"), refresh=False)
        summary.index = dedup.index.stats()
    finally:
        bar.close()
        sink.close()
        if pool is not None:
            pool.shutdown()
        if owned:
            dedup.close()
    summary.seconds = time.perf_counter() - started
    summary.verification = Counter(dedup.counters.verify)
    summary.skipped = stats.skipped_summary()
    return summary
