"""The units of a `replay --workers N` input: an archive's parts (parts.py cuts them) or a
plain JSONL file's ranges, planned in input order. unit_read.py reads one; units.py
schedules them between this process and the workers.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stream_dedup.models import Rejected
from stream_dedup.replay.parts import plan_parts
from stream_dedup.sources.files import Input, plan_inputs
from stream_dedup.sources.stats import SourceStats
from stream_dedup.sources.warc import ArchiveFormat

# A plain JSONL file is cut into ranges of about this many bytes (at line ends), an archive
# into parts of about as many (at records): small enough that the two ends of a replay
# meet within a fraction of a second, large enough that a unit's fixed cost (a future, a
# pipe round trip, planning) stays small.
UNIT_BYTES = 1 << 20
_ADVISE = getattr(mmap, "MADV_DONTNEED", None)  # None where there is no madvise (Windows)


@dataclass(frozen=True, slots=True)
class Unit:
    """A file; the lines of a plain JSONL file starting in bytes [start, end); the records
    of an archive starting there (parts.py); or an archive's rest, read in one piece."""

    path: Path
    name: str
    kind: str  # "archive", "jsonl" (a whole file), "jsonl-range", "archive-part", "archive-rest"
    start: int = 0
    end: int = 0
    first_line: int = 1
    size: int = 0  # bytes of input (what its result in memory grows with)
    fmt: ArchiveFormat | None = None  # an archive part or rest
    last: bool = False  # an archive part that reads to the end of the file
    skip: int = 0  # an archive rest: records its reader drops (accepted in parts before)


def plan_units(paths: Iterable[str | os.PathLike[str]], stats: SourceStats,
               unit_bytes: int = UNIT_BYTES) -> Iterator[Unit | Rejected]:
    """The inputs as units, in input order; an unreadable input as its Rejected (counted
    in `stats`, as FileSource counts it)."""
    for planned in plan_inputs(paths, stats):
        if isinstance(planned, Rejected):
            yield planned
        elif planned.kind == "archive":
            yield from _archive_units(planned, stats, unit_bytes)
        else:
            yield from _jsonl_units(planned, unit_bytes)


def _archive_units(planned: Input, stats: SourceStats, unit_bytes: int) -> Iterator[Unit]:
    """An archive whole, or in parts of about `unit_bytes` (parts.py); a part that starts
    the file does not count it (the file is counted here)."""
    whole = Unit(planned.path, planned.name, "archive", size=file_size(planned.path))
    try:
        fmt, cuts = plan_parts(planned.path, unit_bytes, stats.unsplit)
        cut = next(cuts)
    except (OSError, ValueError):
        yield whole  # its reader says why
        return
    if fmt is None or cut.last:
        yield whole
        return
    stats.files += 1
    while True:
        yield Unit(planned.path, planned.name, "archive-part", cut.start, cut.end,
                   size=cut.end - cut.start, fmt=fmt, last=cut.last)
        if cut.last:
            return
        cut = next(cuts)


def _jsonl_units(planned: Input, unit_bytes: int) -> Iterator[Unit]:
    """A gzipped JSONL file whole; a plain one in ranges cut after a newline, each with
    the number of its first line (iter_jsonl counts every line, blank ones too). The lines
    are found in a map of the file, not read: ~3 µs a 27 KB line. What is planned leaves
    the map (its pages stay in the page cache): pages a map has touched count in this
    process's resident set, which grew by the size of a 270 MB crawl before."""
    whole = Unit(planned.path, planned.name, "jsonl", size=file_size(planned.path))
    try:
        with open(planned.path, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"
            size = os.fstat(fh.fileno()).st_size
            view = None if gzipped or size == 0 else mmap.mmap(fh.fileno(), 0,
                                                                access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        view = None
        gzipped = True  # its reader reports why it cannot be read
    if gzipped or view is None:
        yield whole
        return
    with view:
        start, line, at, lines, released = 0, 1, 0, 0, 0
        while at < size:
            nl = view.find(b"\n", at)
            at = size if nl < 0 else nl + 1
            lines += 1
            if at - start >= unit_bytes or at >= size:
                released = _release(view, released, at)
                yield Unit(planned.path, planned.name, "jsonl-range", start, at, line,
                           at - start)
                start, line, lines = at, line + lines, 0


def _release(view: mmap.mmap, released: int, end: int) -> int:
    """Drop the map's pages from `released` (a page's start) to the page holding `end` from
    this process (not from the page cache); return where the next release starts."""
    last = end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > released and _ADVISE is not None:
        view.madvise(_ADVISE, released, last - released)
        return last
    return released


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # its reader says why
