"""Analyses remembered by body fingerprint, so that a copy of a body is not analysed again
(the replay units, replay/units.py and unit_read.py; the Deduplicator's analysis step,
`analyse_batch`).
An analysis is a function of the body alone (and the Settings, fixed for a process)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from stream_dedup.decide.verdicts import Analysis
from stream_dedup.models import Page
from stream_dedup.pipeline.analysis import AnalysisPool, Analyzer

# Bodies whose analysis a process remembers, so that a copy is not analysed again: at most
# so many, holding at most so many bytes of shingle sets (an analysis is ~3 KB and its set).
# Read when a Memo is made.
REMEMBERED, REMEMBERED_BYTES = 4096, 64 << 20

# An Analysis without its page: (raw_fp, canonical_fp, text_length, shingle_count, sketch,
# features, ld_signature, error, canonical_s, sketch_s, shingles).
Row = tuple[Any, ...]


def as_row(a: Analysis) -> Row:
    return (a.raw_fp, a.canonical_fp, a.text_length, a.shingle_count, a.sketch, a.features,
            a.ld_signature, a.error, a.canonical_s, a.sketch_s, a.shingles)


def from_row(page: Page, row: Row) -> Analysis:
    *fields, tops = row
    return Analysis(page, *fields, shingles=tops)


class Memo:
    """Analyses (rows: no page, no body) by body fingerprint; past `count` of them or
    `nbytes` of shingle sets (REMEMBERED, REMEMBERED_BYTES by default), the least recently
    used go first. Each put is told to `remembered`, each one that goes to `forgotten`."""

    def __init__(self, remembered: Callable[[int], None] | None = None,
                 forgotten: Callable[[int, Row], None] | None = None, *,
                 count: int | None = None, nbytes: int | None = None) -> None:
        self.rows: OrderedDict[int, Row] = OrderedDict()
        self.bytes = 0  # of shingle sets held
        self._remembered, self._forgotten = remembered, forgotten
        self.count = REMEMBERED if count is None else count
        self.nbytes = REMEMBERED_BYTES if nbytes is None else nbytes

    def get(self, fp: int) -> Row | None:
        row = self.rows.get(fp)
        if row is not None:
            self.rows.move_to_end(fp)
        return row

    def put(self, fp: int, row: Row) -> None:
        self.rows[fp] = row
        self.bytes += len(row[-1])
        if self._remembered is not None:
            self._remembered(fp)
        while len(self.rows) > self.count or self.bytes > self.nbytes:
            gone, old = self.rows.popitem(last=False)
            self.bytes -= len(old[-1])
            if self._forgotten is not None:
                self._forgotten(gone, old)


def analyse_batch(analyzer: Analyzer, memo: Memo, lock: AbstractContextManager[Any],
                  pages: list[Page], fps: list[int], stored: list[bool],
                  pool: AnalysisPool | None, ready: list[Analysis | None]) -> list[Analysis]:
    """The Deduplicator's analysis step (pipeline/deduplicator.py): each distinct body analysed once
    (shared with `pool` if given) unless its analysis is `ready` or in `memo` from an
    earlier batch; a copy of a stored page only fingerprinted (as if none were ready: it
    takes the same path). `lock` guards the memo; the analysis runs outside it."""
    todo: dict[int, Page] = {}
    by_fp: dict[int, Analysis] = {}
    with lock:  # (the memo: a caller's threads may share the Deduplicator)
        for page, fp, is_stored, given in zip(pages, fps, stored, ready, strict=True):
            if is_stored or given is not None or fp in todo or fp in by_fp:
                continue
            row = memo.get(fp) if page.revisit is None else None
            if row is not None:
                by_fp[fp] = from_row(page, row)
            else:
                todo[fp] = page
    bodies = list(todo.values())
    if pool is None:
        done = [analyzer.analyze(p) for p in bodies]
    else:
        done = pool.analyse(analyzer, bodies)
    with lock:
        for a in done:
            by_fp[a.raw_fp] = a
            if a.page.revisit is None:
                memo.put(a.raw_fp, as_row(a))
    out = []
    for page, fp, is_stored, given in zip(pages, fps, stored, ready, strict=True):
        a = by_fp.get(fp) if given is None or is_stored else given
        if a is None:
            out.append(Analysis(page, fp))
        else:
            out.append(a if a.page is page else replace(a, page=page))
    return out
