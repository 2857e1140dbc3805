"""How one unit of a `replay --workers N` input (unit_plan.py) is read: with its pages'
analyses, here or in a worker process that sends it back packed (pages without their
bodies and headers), and unpacked here. `units.UnitSource` schedules the units between
this process and the workers.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stream_dedup.decide.verdicts import Analysis, warc_digest
from stream_dedup.models import Page, Rejected
from stream_dedup.pipeline.analysis import Analyzer, raw_fingerprint, worker_analyzer, worker_seen
from stream_dedup.pipeline.memo import REMEMBERED, Memo, Row, as_row, from_row
from stream_dedup.replay.parts import Cut, PartEnd, read_part, read_rest
from stream_dedup.replay.unit_plan import Unit
from stream_dedup.sources.jsonl import iter_jsonl, iter_jsonl_range
from stream_dedup.sources.stats import SourceStats
from stream_dedup.sources.warc import iter_archive

# A unit's pages are read so many (or so many bytes of bodies) at a time and then analysed,
# not one by one: reading (gunzip, FastWARC) and analysing (lexbor, tokens, sketches) then
# each run with their own code and data in the core's caches.
READ_AHEAD_PAGES, READ_AHEAD_BYTES = 32, 4 << 20


@dataclass(slots=True)
class UnitResult:
    items: list[Page | Rejected]
    analyses: list[Analysis | None]
    stats: SourceStats = field(default_factory=SourceStats)
    end: PartEnd | None = None  # an archive part or rest: its records' ordinals, its end
    deferred: list[int] = field(default_factory=list)  # pages read here, not analysed yet


def read_unit(unit: Unit, analyzer: Analyzer, memo: Memo, *,
              tick: Callable[[], None] | None = None,
              elsewhere: Callable[[int], bool] | None = None,
              analysing: Callable[[int], None] | None = None) -> UnitResult:
    """The unit's items (what FileSource reads there), each page's analysis, and the
    readers' counts. `tick` is called after each page. A body not remembered for which
    `elsewhere(fingerprint)` says yes (a worker reads it) is left unanalysed: its index is
    in `deferred`, for `finish_deferred` once the unit is due. `analysing(fingerprint)` is
    told of each body about to be analysed (and remembered in `memo`) here."""
    out = UnitResult([], [], end=_part_end(unit))
    for item in _items(unit, out.stats, out.end,
                       namespace_field=analyzer.settings.namespace_field):
        if isinstance(item, Rejected):
            out.items.append(item)
            out.analyses.append(None)
            continue
        out.items.append(item)
        fp = raw_fingerprint(item.body)
        new = item.revisit is None and fp not in memo.rows
        if new and elsewhere is not None and elsewhere(fp):
            out.deferred.append(len(out.analyses))
            out.analyses.append(None)
        else:
            if new and analysing is not None:
                analysing(fp)
            out.analyses.append(_analysis(item, analyzer, memo, fp))
        if tick is not None:
            tick()
    return out


def _analysis(page: Page, analyzer: Analyzer, memo: Memo, fp: int | None = None
              ) -> Analysis:
    row = _row(page, analyzer, memo, fp=fp)
    assert isinstance(row, tuple)
    return from_row(page, row)


def finish_deferred(result: UnitResult, analyzer: Analyzer, memo: Memo) -> int:
    """Analyse the pages `read_unit` left (remembered by now, most of them: a copy a worker
    read in an earlier unit); return how many were not, and were analysed here."""
    analysed = 0
    for i in result.deferred:
        page = result.items[i]
        assert isinstance(page, Page)
        analysed += raw_fingerprint(page.body) not in memo.rows
        result.analyses[i] = _analysis(page, analyzer, memo)
    result.deferred.clear()
    return analysed


def _part_end(unit: Unit) -> PartEnd | None:
    return PartEnd() if unit.kind in ("archive-part", "archive-rest") else None


def _items(unit: Unit, stats: SourceStats, end: PartEnd | None,
           reading: Callable[[list[Page | Rejected]], None] | None = None, *,
           namespace_field: str = "") -> Iterator[Page | Rejected]:
    """The unit's items; an archive part's or rest's without sources (`end` gets their
    ordinals in the file, counted from the unit's first record). `reading` sees each
    read-ahead chunk before its items are yielded. `namespace_field`: JSONL lines name
    their pages' namespaces there (--namespace-field)."""
    if unit.kind == "archive":
        items = iter_archive(unit.path, stats, name=unit.name)
    elif unit.kind in ("archive-part", "archive-rest"):
        assert unit.fmt is not None and end is not None
        items = (read_part(unit.path, unit.fmt, Cut(unit.start, unit.end, unit.last), stats,
                           end) if unit.kind == "archive-part"
                 else read_rest(unit.path, unit.fmt, unit.start, unit.skip, stats, end))
    elif unit.kind == "jsonl":
        items = iter_jsonl(unit.path, stats, name=unit.name, namespace_field=namespace_field)
    else:
        items = iter_jsonl_range(unit.path, unit.start, unit.end, unit.first_line, stats,
                                 name=unit.name, namespace_field=namespace_field)
    for item in _read_ahead(items, reading):
        if isinstance(item, Rejected) and item.kind == "unreadable-file":
            stats.unreadable.append(item.message)
        yield item


def _read_ahead(items: Iterator[Page | Rejected],
                reading: Callable[[list[Page | Rejected]], None] | None = None
                ) -> Iterator[Page | Rejected]:
    """`items`, read READ_AHEAD_PAGES or READ_AHEAD_BYTES at a time (each chunk shown to
    `reading` first)."""
    chunk: list[Page | Rejected] = []
    size = 0
    for item in items:
        chunk.append(item)
        size += len(item.body) if isinstance(item, Page) else 0
        if len(chunk) >= READ_AHEAD_PAGES or size >= READ_AHEAD_BYTES:
            if reading is not None:
                reading(chunk)
            yield from chunk
            chunk, size = [], 0
    if reading is not None:
        reading(chunk)
    yield from chunk


def _row(page: Page, analyzer: Analyzer, memo: Memo,
         parent: Callable[[int], bool] | None = None, fp: int | None = None) -> Row | int:
    """The page's analysis as a Row, or just its body's fingerprint where `parent(fp)`
    says the parent process remembers it. `fp`: the body's, if the caller has it."""
    if fp is None:  # the key the pipeline itself decides exact copies by
        fp = raw_fingerprint(page.body)
    if page.revisit is not None:  # a revisit has no body to share
        return as_row(analyzer.analyze(page))
    # The parent first: a row it has need not be pickled, sent and read back (an analysed
    # page's row is ~3.7 KB, most of it the shingles kept for containment).
    if parent is not None and parent(fp):
        return fp
    seen = memo.get(fp)
    if seen is not None:
        return seen
    row = as_row(analyzer.analyze(page))
    memo.put(fp, row)  # not the page: its body is ~90 KB
    return row


@dataclass(slots=True)
class Packed:
    """A unit's result as a worker sends it: no Page or Analysis objects, no bodies, the
    sketches and features of all its pages in one buffer each (pickling each page's
    objects cost ~18 µs a page there and ~20 here; this, a few)."""

    # A page: (url, fetched_at, status, source, position, body bytes, payload digest,
    # revisit, namespace). Not its body nor its HTTP headers: its analysis has used them,
    # and deciding does not (headers were ~1 KB of the ~1.2 KB a page's tuple pickled to).
    items: list[Rejected | tuple[Any, ...]]
    rows: list[Row | int | None]  # sketch True (in `sketches`, features in `features`);
    #                          a fingerprint: the parent's (see shared_fps); None: a reject
    sketches: bytes
    features: bytes
    sketch_dtype: str
    sketch_width: int
    stats: SourceStats
    end: PartEnd | None = None


_MEMO = Memo()  # a worker process's
_DIGESTS: OrderedDict[int, str] = OrderedDict()  # a worker process's, by raw fingerprint


def _digest(fp: int, body: bytes) -> str:
    """warc_digest(body), not computed again for a copy (5.6 % of a worker's time on a
    WARC of 11 copies of the corpus's pages)."""
    digest = _DIGESTS.get(fp)
    if digest is None:
        digest = _DIGESTS[fp] = warc_digest(body)
        if len(_DIGESTS) > REMEMBERED:
            _DIGESTS.popitem(last=False)
    return digest


def worker_read(unit: Unit) -> Packed:
    """In a worker process: the unit read and analysed, packed."""
    analyzer = worker_analyzer()
    stats = SourceStats()
    end = _part_end(unit)
    items: list[Rejected | tuple[Any, ...]] = []
    rows: list[Row | int | None] = []
    sketches: list[np.ndarray] = []
    features: list[np.ndarray] = []
    seen = worker_seen()
    parent = seen.in_parent if seen is not None else None
    fps: dict[int, int] = {}  # id(page) -> its body's fingerprint, for the chunk read ahead

    def reading(chunk: list[Page | Rejected]) -> None:
        """Tell the parent which bodies this worker is about to analyse."""
        fps.clear()
        for item in chunk:
            if isinstance(item, Page):
                fp = fps[id(item)] = raw_fingerprint(item.body)
                if seen is not None and item.revisit is None:
                    seen.reading(fp)

    for item in _items(unit, stats, end, reading,
                       namespace_field=analyzer.settings.namespace_field):
        if isinstance(item, Rejected):
            items.append(item)
            rows.append(None)
            continue
        row = _row(item, analyzer, _MEMO, parent, fps.get(id(item)))
        fp = row if isinstance(row, int) else row[0]
        # The body stays here: the digest an unchanged page's decision reports (decide/step.py,
        # computed from the body when the crawler gave none) goes with the page. 2.3 % of
        # the analysis time of the corpus's pages (416 of 854 came without one).
        digest = item.payload_digest
        if digest is None and item.body and item.revisit is None:
            digest = _digest(fp, item.body)
        items.append((item.url, item.fetched_at, item.status, item.source, item.position,
                      len(item.body), digest, item.revisit, item.namespace))
        if not isinstance(row, int) and row[4] is not None:  # in the buffers: marked True
            sketches.append(row[4])
            features.append(row[5])
            row = (*row[:4], True, None, *row[6:])
        rows.append(row)
    sk = np.concatenate(sketches) if sketches else np.zeros(0, np.uint32)
    width = sketches[0].shape[0] if sketches else 0
    ft = np.concatenate(features) if features else np.zeros(0, np.uint64)
    return Packed(items, rows, sk.tobytes(), ft.tobytes(), sk.dtype.str, width, stats, end)


def unpack(packed: Packed, sources: list[str] | None = None,
           remembered: Callable[[int], Row] | None = None) -> UnitResult:
    """A worker's result as items (pages without bodies or headers) and their analyses; with
    `sources`, each item's (an archive part's items come without). A page the worker sent
    only its body's fingerprint for gets `remembered(fp)`."""
    out = UnitResult([], [], packed.stats, packed.end)
    sketches = np.frombuffer(packed.sketches, packed.sketch_dtype)
    features = np.frombuffer(packed.features, np.uint64)
    if packed.sketch_width:
        sketches = sketches.reshape(-1, packed.sketch_width)
        features = features.reshape(sketches.shape[0], -1)
    k = 0
    for i, (item, row) in enumerate(zip(packed.items, packed.rows, strict=True)):
        if row is None:
            assert isinstance(item, Rejected)
            out.items.append(item if sources is None
                             else dataclasses.replace(item, source=sources[i]))
            out.analyses.append(None)
            continue
        assert isinstance(item, tuple)
        url, fetched_at, status, source, position, size, digest, revisit, namespace = item
        if sources is not None:
            source = sources[i]
        page = Page(url, b"", (), fetched_at, status, source, position, digest, revisit,
                    namespace=namespace)
        if isinstance(row, int):
            if remembered is None:
                raise ValueError("a unit with remembered analyses, unpacked without them")
            row = remembered(row)
        raw_fp, canonical_fp, text_length, shingle_count, sk, ft, sig, error, c_s, s_s, tops = row
        if sk is True:
            sk, ft = sketches[k], features[k]
            k += 1
        out.items.append(page)
        out.analyses.append(Analysis(page, raw_fp, canonical_fp, text_length, shingle_count,
                                     sk, ft, sig, error, c_s, s_s, size, tops))
    return out


def with_sources(result: UnitResult, sources: list[str]) -> UnitResult:
    """An archive part read here, each item with its source (its pages keep their bodies).
    Built field by field: dataclasses.replace costs ~10 µs a page, twice."""
    out = UnitResult([], [], result.stats, result.end)
    for item, a, source in zip(result.items, result.analyses, sources, strict=True):
        if isinstance(item, Rejected) or a is None:
            out.items.append(dataclasses.replace(item, source=source))
            out.analyses.append(None)
            continue
        page = Page(item.url, item.body, item.headers, item.fetched_at, item.status, source,
                    item.position, item.payload_digest, item.revisit, item.carried,
                    item.namespace)
        out.items.append(page)
        out.analyses.append(Analysis(page, a.raw_fp, a.canonical_fp, a.text_length,
                                     a.shingle_count, a.sketch, a.features, a.ld_signature,
                                     a.error, a.canonical_s, a.sketch_s, a.body_bytes,
                                     a.shingles))
    return out


def merge_stats(into: SourceStats, more: SourceStats) -> None:
    into.files += more.files
    into.records += more.records
    into.pages += more.pages
    into.non_2xx += more.non_2xx
    into.revisits += more.revisits
    into.skipped.update(more.skipped)
    into.rejected.update(more.rejected)
    into.unreadable.extend(more.unreadable)
    into.repeated.extend(more.repeated)
    into.unsplit.extend(more.unsplit)
