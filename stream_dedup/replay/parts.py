"""One WARC or ARC file in parts, so that a big archive feeds every `--workers` process.

    plan (this process)              read (any process)               settle (this process,
                                                                      in input order)
    cut near every `unit_bytes`:     the records that start in        accept a part only if it
    at a gzip member that opens      [start, end), numbered from 0;   starts where the one
    a record header (record-         and where the next record        before it found its next
    gzipped files), or at a record   starts, read on from them        record; number its records
    header line (plain files)                                         after theirs

Why a part reads what the whole file's reader (warc.py `iter_archive`) reads there: the
first part starts at 0, and a part is accepted only where the part before it, reading on,
found the next record (`PartEnd.reached`). So every accepted part starts at a record the
whole file's reader starts too, with nothing open (a fresh gzip member, no record begun),
and the same reader (FastWARC for WARC, the lenient reader for ARC) reads the same records.
A cut that only looks like a record start (a gzip member inside a stored payload, e.g. a
crawled .warc.gz; a header line inside a body) fails that check: the part is dropped and
the range from the real next record is read in its place. Record ordinals: each part counts
from 0 and says how many records it read; this process adds the records before it.

Where the whole file's reader changes course, a part cannot follow, so the rest of the file
is read in one piece as that reader reads it (a "rest"), and its later parts are dropped:
- WARC: FastWARC stops at damage (an exception, a record it misreads, a corrupt member),
  and the whole file's reader goes on with the lenient reader from the last record FastWARC
  delivered. The part keeps the records it read; the rest is that lenient read. The last
  part does the whole file's tail check itself (it knows the offset), so the common damage,
  a truncated last member, costs nothing more.
- ARC (always the lenient reader): any reject of the reader (junk, damage, a truncated
  record) names offsets counted from where the reader started, so a part that meets one is
  dropped, and the rest is the lenient read of the whole file without the records already
  accepted.
A file whose first gzip member holds more than its first record is one gzip stream: it is
read whole, by one process, and the replay summary says so (with the fix: recompress it
one member per record).
"""

from __future__ import annotations

import bisect
import mmap
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fastwarc.warc import ArchiveIterator as FastArchiveIterator

from stream_dedup.models import Page, Rejected
from stream_dedup.sources.archive_record import GZIP_MAGIC, ArchiveFormat, Frame
from stream_dedup.sources.fastwarc_reader import from_fastwarc, starts_record
from stream_dedup.sources.lenient import arc_header, lenient_items
from stream_dedup.sources.stats import SourceStats
from stream_dedup.sources.warc import archive_format, convert_records, read_head

# What a cut is checked with: the start of the data after it (gunzipped from at most so
# many bytes of the file), which must be a whole record header line (WARC: and a
# Content-Length, if the header ends within it). 4 KiB: a cut costs 107 µs, not 134.
_PROBE = 4 << 10
# How much of the first gzip member is gunzipped to tell one stream from one member per
# record: the first record (warcinfo, an ARC's filedesc) is a few hundred bytes.
_FIRST_MEMBER = 1 << 20
TAPER = 8  # the last parts of a file shrink to unit_bytes / TAPER (`_step`)
_WARC_LINE = re.compile(rb"WARC/\d+\.\d+\r?\n")
_HEADER_END = re.compile(rb"\r?\n\r?\n")
_LENGTH = re.compile(rb"^content-length:[ \t]*(\d+)[ \t]*\r?$", re.IGNORECASE | re.MULTILINE)


@dataclass(slots=True)
class PartEnd:
    """What reading a part (or a rest) found, beside its items."""

    ordinals: list[int] = field(default_factory=list)  # each item's record, from 0
    records: int = 0  # records read (the ordinals the part used)
    reached: int | None = None  # file offset of the first record at or after its end
    last_record: int | None = None  # WARC: file offset of the last record FastWARC read
    finished: bool = False  # read to the end of the file as the whole file's reader does


# --- plan -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cut:
    """Records starting in [start, end) of a file; `last`: to its end."""

    start: int
    end: int
    last: bool


def plan_parts(path: Path, unit_bytes: int, unsplit: list[str]
               ) -> tuple[ArchiveFormat | None, Iterator[Cut]]:
    """The file's format and its parts in order: one whole Cut when it is not worth
    cutting or cannot be cut (then, if it is a gzip stream that should have been, its path
    is added to `unsplit`). Parts are found as they are asked for (~110 µs a cut: 7 ms
    for a 64 MB WARC, ~0.1 s a GB). Raises OSError if the file cannot be read."""
    size = path.stat().st_size
    fmt = archive_format(read_head(path))
    if fmt is None or size < 2 * unit_bytes:
        return fmt, iter([Cut(0, size, True)])
    return fmt, _cuts(path, fmt, size, unit_bytes, unsplit)


def _cuts(path: Path, fmt: ArchiveFormat, size: int, unit_bytes: int, unsplit: list[str]
          ) -> Iterator[Cut]:
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
        gzipped = view[:3] == GZIP_MAGIC
        if gzipped and _first_member_holds_more(view, fmt):
            unsplit.append(str(path))
            yield Cut(0, size, True)
            return
        start = 0
        while (cut := _record_start(view, start + _step(size - start, unit_bytes), fmt,
                                    gzipped)) is not None:
            yield Cut(start, cut, False)
            start = cut
        if start == 0 and gzipped:
            unsplit.append(str(path))  # no member opens a record after the first MB
        yield Cut(start, size, True)


def _step(left: int, unit_bytes: int) -> int:
    """The size of the next part: `unit_bytes`, shrinking over the file's last 8 of them
    to an eighth of it (an eighth of what is left). A process that takes the last part
    is what every other waits for at the end of a file: with 1 MiB parts, ~0.1 s of
    work, half of it lost on average with two processes."""
    return max(unit_bytes // TAPER, min(unit_bytes, left // TAPER))


def _first_member_holds_more(view: mmap.mmap, fmt: ArchiveFormat) -> bool:
    """Whether the first gzip member goes on past the end of its first record (a few
    bytes of separator aside): not one member per record."""
    decoder = zlib.decompressobj(31)
    try:
        data = decoder.decompress(view[:_FIRST_MEMBER], _FIRST_MEMBER)
    except zlib.error:
        return False  # the readers report the damage
    length = _first_record_length(data, fmt)
    return length is not None and len(data) > length + 16


def _first_record_length(data: bytes, fmt: ArchiveFormat) -> int | None:
    """Bytes of the first record (header and block) at the start of `data`, if it says."""
    if fmt == "arc":
        line, nl, _ = data.partition(b"\n")
        head = arc_header(line + nl)
        return None if head is None else len(line) + 1 + max(head[5], 0)
    end = _HEADER_END.search(data)
    found = _LENGTH.search(data, 0, end.start() + 2) if end else None
    return None if end is None or found is None else end.end() + int(found[1])


def _record_start(view: mmap.mmap, at: int, fmt: ArchiveFormat, gzipped: bool) -> int | None:
    """The first offset >= `at` where a record seems to start: a gzip member whose data
    opens with a record header (gzipped), or a record header line (plain)."""
    size = len(view)
    while at < size:
        if gzipped:
            found = view.find(GZIP_MAGIC, at)
        elif fmt == "warc":
            found = view.find(b"\nWARC/", at - 1) + 1 or -1
        else:
            found = view.find(b"\n", at - 1) + 1 or -1
        if found < 0 or found >= size:
            return None
        if _opens_record(_probe(view, found, gzipped), fmt):
            return found
        at = found + 1
    return None


def _probe(view: mmap.mmap, at: int, gzipped: bool) -> bytes:
    if not gzipped:
        return view[at:at + _PROBE]
    try:
        return zlib.decompressobj(31).decompress(view[at:at + _PROBE], _PROBE)
    except zlib.error:
        return b""


def _opens_record(head: bytes, fmt: ArchiveFormat) -> bool:
    if fmt == "arc":  # stricter than the reader: a URL without spaces (ARC v1 or v2)
        line, nl, _ = head.partition(b"\n")
        return bool(nl) and len(line.split()) in (5, 10) and arc_header(line + nl) is not None
    if not _WARC_LINE.match(head):
        return False
    end = _HEADER_END.search(head)
    if end is None:  # a header longer than the probe: its first line will do
        return len(head) >= _PROBE
    return _LENGTH.search(head, 0, end.start() + 2) is not None


# --- read -------------------------------------------------------------------------------------


def read_part(path: Path, fmt: ArchiveFormat, cut: Cut, stats: SourceStats, end: PartEnd
              ) -> Iterator[Page | Rejected]:
    """The items of the records starting in the cut, without sources (`end.ordinals` has
    each one's record, counted from the cut's start); `end` says where the reading ended."""
    items = (_warc_part(path, cut, end) if fmt == "warc" else _lenient_part(path, fmt, cut, end))
    before = stats.records
    yield from convert_records(items, stats, path, None, end.ordinals)
    end.records = stats.records - before


def read_rest(path: Path, fmt: ArchiveFormat, offset: int, skip: int, stats: SourceStats,
              end: PartEnd) -> Iterator[Page | Rejected]:
    """What the whole file's lenient reader reads from `offset` with `skip` (see the
    module's docstring), numbered from 0 like a part."""
    before = stats.records
    yield from convert_records(lenient_items(path, fmt, offset, skip), stats, path, None,
                               end.ordinals)
    end.records = stats.records - before
    end.finished = True


def _warc_part(path: Path, cut: Cut, end: PartEnd) -> Iterator[Frame | Rejected]:
    """fastwarc_reader.py `warc_items` over the cut: FastWARC until the first record at or
    past the cut's end; the last part also checks the tail with the lenient reader."""
    try:
        with open(path, "rb") as fh:
            fh.seek(cut.start)
            for record in FastArchiveIterator(fh, parse_http=False):
                if not cut.last and record.stream_pos >= cut.end:
                    end.reached = record.stream_pos
                    return
                frame = from_fastwarc(record)
                end.last_record = record.stream_pos
                yield frame
    except Exception:  # as in warc_items: the rest of the file goes to the lenient reader
        return
    if cut.last and end.last_record is not None and starts_record(path, end.last_record):
        yield from lenient_items(path, "warc", offset=end.last_record, skip=1)
        end.finished = True


def _lenient_part(path: Path, fmt: ArchiveFormat, cut: Cut, end: PartEnd
                  ) -> Iterator[Frame | Rejected]:
    """The lenient reader from the cut's start, up to the first record at or past its end;
    it stops at its first reject (see the module's docstring)."""
    members: list[tuple[int, int]] = []  # (decompressed offset, file offset), gzip only
    for item in lenient_items(path, fmt, cut.start, members=members):
        if isinstance(item, Rejected):
            return
        if not cut.last:
            at, aligned = _file_offset(item.start, members, cut.start)
            if at >= cut.end:
                end.reached = at if aligned else None
                return
        yield item
    end.finished = cut.last


def _file_offset(start: int, members: list[tuple[int, int]], base: int) -> tuple[int, bool]:
    """A frame's start as a file offset (of its gzip member) and whether it opens it."""
    if not members:  # a plain file: the reader counts file offsets
        return start, True
    i = bisect.bisect_right(members, (start, 1 << 62)) - 1
    if i < 0:
        return base, False
    first, offset = members[i]
    return offset, first == start


# --- settle -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settled:
    """What becomes of a part: `base`, its first record's ordinal (None: dropped); read
    `again` from this offset (to the same end) in its place; then read the `rest`
    (offset, skip) of the file in one piece."""

    base: int | None
    again: int | None = None
    rest: tuple[int, int] | None = None


@dataclass(slots=True)
class Chain:
    """One file's parts as they are settled, in input order."""

    path: Path
    fmt: ArchiveFormat
    expect: int = 0  # where the next part must start: the next record the last one found
    records: int = 0  # records accepted so far: the next part's first ordinal
    last_record: int | None = None  # WARC: the last record FastWARC read
    done: bool = False  # read to the end: any later part is dropped

    def settle(self, cut: Cut, end: PartEnd, rest: bool = False) -> Settled:
        if self.done and not rest:
            return Settled(None)
        base = self.records
        if rest:
            self.records += end.records
            self.done = True
            return Settled(base)
        if cut.start != self.expect:  # the cut fell inside a record of the part before
            again = self.expect if self.expect < cut.end else None
            return Settled(None, again=again)
        if end.reached is not None or end.finished:
            self.records += end.records
            self.last_record = end.last_record if end.last_record is not None \
                else self.last_record
            self.expect = end.reached if end.reached is not None else cut.end
            self.done = end.finished
            return Settled(base)
        self.done = True  # read on as the whole file's reader does, in one piece
        if self.fmt == "arc":
            return Settled(None, rest=(0, base))
        self.records += end.records
        if end.last_record is not None:
            self.last_record = end.last_record
        at = self.last_record
        if at is not None and starts_record(self.path, at):
            return Settled(base, rest=(at, 1))
        return Settled(base, rest=(0, self.records))
