"""The analyses a `replay --workers N` remembers in its own process, and what its workers
are told of them (shared_fps.py): a worker that finds a body in the parent's table sends
back only the body's fingerprint, and the analysis is filled in here (unit_read.unpack).
An analysis this process forgets (Memo's bounds) is kept until every unit sent out before
is back, since a worker may have been told it is here. units.UnitSource holds one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from stream_dedup.models import Page
from stream_dedup.pipeline.memo import Memo, Row, as_row

if TYPE_CHECKING:
    from stream_dedup.replay.unit_read import UnitResult
    from stream_dedup.workers.shared_fps import SharedFingerprints


class UnitMemo:
    """`memo` (the analyses this process remembers), told to the workers' shared tables
    that `seen()` gives (None: no forked workers, nothing to tell)."""

    def __init__(self, seen: Callable[[], SharedFingerprints | None]) -> None:
        self._seen = seen
        self.memo = Memo(self._remember, self._forget)
        # Analyses forgotten, kept until every unit sent out before is back:
        # fp -> (units sent when forgotten, row), in the order they were forgotten.
        self._forgotten: OrderedDict[int, tuple[int, Row]] = OrderedDict()
        self.sent = 0  # units submitted to the workers (UnitSource counts them here)

    def remembered(self, result: UnitResult) -> UnitResult:
        """A worker's result, its analyses also remembered here: a copy this process reads
        later is not analysed again (on a WARC of 11 copies of the corpus's pages, this
        process analysed all 450 distinct bodies the worker had analysed)."""
        rows = self.memo.rows
        for item, a in zip(result.items, result.analyses, strict=True):
            if a is not None and a.raw_fp not in rows and isinstance(item, Page) \
                    and item.revisit is None:
                self.memo.put(a.raw_fp, as_row(a))
        return result

    def analysing(self, fp: int) -> None:
        """This process is about to analyse `fp`'s body (and remember it): told to the
        workers now, not once it is done, so that a worker reading a copy meanwhile sends
        back its fingerprint instead of analysing it too. Its analysis is here by the time
        such a unit is unpacked: that happens in the thread that analyses, after it."""
        self._remember(fp)

    def recall(self, fp: int) -> Row:
        """The analysis a worker was told this process remembers."""
        row = self.memo.get(fp)
        if row is None:
            kept = self._forgotten.get(fp)
            if kept is None:
                raise RuntimeError(f"a worker left body {fp:#x} to this process, which does "
                                   "not have its analysis")
            row = kept[1]
        return row

    def bury(self, oldest_out: int | None) -> None:
        """Drop the forgotten analyses no unit still out may ask for: those forgotten
        before the unit numbered `oldest_out` (the earliest still out; None: all back)
        was sent."""
        out = self.sent + 1 if oldest_out is None else oldest_out
        while self._forgotten:
            fp, (sent, _) = next(iter(self._forgotten.items()))
            if sent >= out:
                break
            del self._forgotten[fp]

    def _remember(self, fp: int) -> None:
        seen = self._seen()
        if seen is not None:
            seen.remember(fp, self.memo.rows)

    def _forget(self, fp: int, row: Row) -> None:
        seen = self._seen()
        if seen is not None:
            seen.forget(fp)
            self._forgotten.pop(fp, None)
            self._forgotten[fp] = (self.sent, row)
