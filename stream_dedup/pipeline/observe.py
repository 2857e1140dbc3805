"""What the Deduplicator tells about each decision (deduplicator.py): the stage timings of a page,
the Observer protocol it reports to (metrics.Metrics is one), and what verification did."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from stream_dedup.index.base import FeatureIndex
from stream_dedup.models import NEAR, VERIFIED_DISTINCT, Decision


class StageTimes(NamedTuple):
    """Seconds one page spent in each stage; 0.0 means the stage did not run."""

    canonical_s: float = 0.0
    sketch_s: float = 0.0
    index_s: float = 0.0
    verify_s: float = 0.0


NOT_RUN = StageTimes()


class Observer(Protocol):
    """Told about every decision (called in the deciding thread; keep it cheap)."""

    def page(self, decision: Decision, nbytes: int, times: StageTimes) -> None:
        """A page was decided (once per page; `nbytes` is its body size; the decision
        names its namespace: an unbounded set, metrics.py caps it as a label)."""

    def redelivered(self, decision: Decision) -> None:
        """A page delivered again got its earlier decision back."""

    def batch(self, index: FeatureIndex) -> None:
        """A batch is decided (a moment to look at the index)."""


class NullObserver:
    def page(self, decision: Decision, nbytes: int, times: StageTimes) -> None:
        pass

    def redelivered(self, decision: Decision) -> None:
        pass

    def batch(self, index: FeatureIndex) -> None:
        pass


def verify_outcome(d: Decision) -> str | None:
    """What verification did for this decision: confirmed, overturned, unsampled or None."""
    if d.reason == NEAR:
        return "confirmed" if d.verified else "unsampled"
    return "overturned" if d.reason == VERIFIED_DISTINCT else None
