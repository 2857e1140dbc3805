"""Pages out of WARC and ARC files, for `stream-dedup replay`.

Only HTTP responses with an HTML content type become Pages; every other record is counted in
`SourceStats` and skipped. Non-2xx responses are Pages too: whether to keep them is the
engine's decision. A broken record becomes a `Rejected` and reading goes on; nothing raises
out of `iter_archive` for bad data.

Reader choice, measured on ../shared/corpora/warc (53 files, 42 MB): time to iterate every
record and read every response payload, best of 5. WARC (49 files): FastWARC 2.0.1 0.14 s,
warcio 1.8.1 0.46 s, our lenient reader 0.28 s; so WARC goes through FastWARC (strict mode).
ARC: FastWARC reads none, warcio rejects Common Crawl's 2008 ARC v1 (no blank line between
records) and on the two ARC files it reads takes 0.028 s to our reader's 0.018 s; so ARC
always uses ours. FastWARC silently drops a truncated last gzip member and stops at a damaged
one, so after it ends (or fails) our reader goes on from the last record FastWARC delivered:
it checks the tail and carries on past any damage, with the same record ordinals.

The lenient reader takes gzip member by member, skips damaged members and non-gzip junk to the
next member, accepts any `WARC/x.y` and LF-only line ends, and resynchronises on the next
record header after garbage or a wrong Content-Length.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

from fastwarc.warc import ArchiveIterator as FastArchiveIterator
from fastwarc.warc import WarcRecord, WarcRecordType

from stream_dedup.errors import PageError
from stream_dedup.models import Page, Rejected, Revisit
from stream_dedup.sources.http import (
    Headers,
    decode_body,
    header_value,
    is_html,
    looks_like_http,
    parse_response,
)

ArchiveFormat = Literal["warc", "arc"]

_GZIP_MAGIC = b"\x1f\x8b\x08"
_CHUNK = 1 << 16
_MAX_LINE = 1 << 16
_HEAD = 1 << 16  # enough for the HTTP headers of a response
_ARC_DATE = re.compile(rb"\d{12,14}")
_ISO_DATE = re.compile(r"\d{4}-\d\d-\d\dT")


@dataclass
class SourceStats:
    """What the readers saw, for the replay summary; updated as items are yielded."""

    files: int = 0
    records: int = 0  # archive records / non-blank JSONL lines, broken ones included
    pages: int = 0
    non_2xx: int = 0  # pages whose HTTP status is not 2xx (yielded all the same)
    revisits: int = 0  # revisit records yielded (decided against the version they name)
    skipped: Counter[str] = field(default_factory=Counter)  # record type, or "non-html"
    rejected: Counter[str] = field(default_factory=Counter)  # Rejected kind
    unreadable: list[str] = field(default_factory=list)  # "path: why", a file or its rest
    repeated: list[str] = field(default_factory=list)  # inputs given again, not read again
    # big archives one process had to read whole, being one gzip stream (sources/parts.py)
    unsplit: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {k: dict(v) if isinstance(v, Counter) else v for k, v in vars(self).items()}

    def skipped_summary(self) -> dict[str, int]:
        """Skipped records by reason (record type or "non-html"), most frequent first."""
        return dict(self.skipped.most_common())


@dataclass(frozen=True, slots=True)
class _Frame:
    """One archive record as framed, before any HTTP parsing; `block` only for responses."""

    start: int
    rec_type: str
    url: str | None
    date: str | None
    content_type: str | None
    headers: Headers
    length: int
    block: bytes | None = None
    truncated: bool = False


def archive_format(head: bytes) -> ArchiveFormat | None:
    """WARC or ARC, judged from the first (decompressed) bytes of a file."""
    line = head.lstrip(b"\r\n").split(b"\n", 1)[0]
    if line.startswith(b"WARC/"):
        return "warc"
    return "arc" if _arc_header(line + b"\n") is not None else None


def read_head(path: Path, size: int = 4096) -> bytes:
    """First `size` bytes of the file's content, gunzipped if needed (partial data is fine)."""
    with open(path, "rb") as fh:
        raw = fh.read(_CHUNK)
    if raw.startswith(_GZIP_MAGIC[:2]):
        try:
            return zlib.decompressobj(31).decompress(raw, size)
        except zlib.error:
            return b""
    return raw[:size]


def iter_archive(
    path: str | os.PathLike[str], stats: SourceStats | None = None, *, name: str | None = None
) -> Iterator[Page | Rejected]:
    """Pages (and Rejected records) of one WARC/ARC file, gzipped or not, in file order.

    `source` is f"{name}#{n}", n the 0-based ordinal of the record in the file (all record
    types count); `name` defaults to the file name.
    """
    path = Path(path)
    name = name or path.name
    stats = stats if stats is not None else SourceStats()
    stats.files += 1
    try:
        fmt = archive_format(read_head(path))
    except OSError as exc:
        yield _unreadable(stats, f"cannot read {path}: {exc}", f"{name}#0")
        return
    if fmt is None:
        msg = f"{path} is neither WARC nor ARC (no 'WARC/' or ARC header line at the start)"
        yield _unreadable(stats, msg, f"{name}#0")
        return
    items = _warc_items(path) if fmt == "warc" else _lenient_items(path, "arc")
    yield from convert_records(items, stats, path, name)


def convert_records(items: Iterator[_Frame | Rejected], stats: SourceStats, path: Path,
                    name: str | None, ordinals: list[int] | None = None,
                    ) -> Iterator[Page | Rejected]:
    """The records of a reader as Pages and Rejects (a skipped record gives nothing), each
    record counted with its 0-based ordinal n: `source` is f"{name}#{n}"; with `name` None
    it is None and each item's n is appended to `ordinals` (a part of a file numbers its
    records from 0, and the replay renumbers them; sources/parts.py)."""
    ordinal = 0
    try:
        for item in items:
            stats.records += 1
            source = None if name is None else f"{name}#{ordinal}"
            if isinstance(item, _Frame):
                out = _convert(item, stats, source)
            else:
                out = dataclasses.replace(item, source=source)
            if isinstance(out, Rejected):
                stats.rejected[out.kind] += 1
            if out is not None:
                if ordinals is not None:
                    ordinals.append(ordinal)
                yield out
            ordinal += 1
    except OSError as exc:  # the disk, not the data
        if ordinals is not None:
            ordinals.append(ordinal)
        yield _unreadable(stats, f"read error in {path}: {exc}",
                          None if name is None else f"{name}#{ordinal}")


def _unreadable(stats: SourceStats, message: str, source: str | None) -> Rejected:
    stats.rejected["unreadable-file"] += 1
    return Rejected(url=None, kind="unreadable-file", message=message, source=source)


def _convert(frame: _Frame, stats: SourceStats, source: str | None) -> Page | Rejected | None:
    """A frame becomes a Page, a Rejected, or None (skipped and counted).

    A truncated record of any type is reported: it means the file was cut short.
    """
    block = frame.block or b""
    if frame.truncated:
        msg = f"record holds {len(block)} of its {frame.length} bytes: the file ends early"
        if frame.length < 0:
            msg = "the file ends inside the record header"
        return Rejected(frame.url, "truncated", msg, source, block)
    if frame.rec_type == "revisit":
        return _revisit(frame, stats, source)
    if frame.rec_type != "response":
        stats.skipped[frame.rec_type] += 1
        return None
    if not frame.url:
        return Rejected(None, "bad-record", "response record without a target URI", source, block)
    status: int | None = None
    if looks_like_http(block):
        try:
            response = parse_response(block)
            if not is_html(response.header("Content-Type") or frame.content_type):
                stats.skipped["non-html"] += 1
                return None
            body = decode_body(response.body, response.headers)
        except PageError as exc:
            return Rejected(frame.url, exc.kind, exc.message, source, block)
        headers, status = response.headers, response.status
    elif is_html(frame.content_type):
        # Wayback-style records: HTTP headers in the WARC header block, block = bare body.
        body = block
        headers = tuple(h for h in frame.headers if not h[0].lower().startswith("warc-"))
    elif "application/http" in (frame.content_type or "").lower():
        msg = f"block declared application/http but starts with {block[:40]!r}"
        return Rejected(frame.url, "bad-http", msg, source, block)
    else:
        stats.skipped["non-html"] += 1
        return None
    stats.pages += 1
    if status is not None and not 200 <= status < 300:
        stats.non_2xx += 1
    digest = header_value(frame.headers, "WARC-Payload-Digest")
    return Page(frame.url, body, headers, frame.date, status, source,
                payload_digest=digest.strip() if digest else None)


_REVISIT_PROFILES = ("identical-payload-digest", "server-not-modified")


def _revisit(frame: _Frame, stats: SourceStats, source: str | None) -> Page | Rejected | None:
    """A revisit record of a profile that says "the payload has not changed" becomes a
    Page without a body (decided against the version it refers to); other profiles are
    skipped."""
    profile = (header_value(frame.headers, "WARC-Profile") or "").strip()
    if not profile.endswith(_REVISIT_PROFILES):
        stats.skipped["revisit"] += 1
        return None
    if not frame.url:
        return Rejected(None, "bad-record", "revisit record without a target URI", source)
    refers = _uri(header_value(frame.headers, "WARC-Refers-To-Target-URI"))
    refers_date = _warc_date(header_value(frame.headers, "WARC-Refers-To-Date"))
    digest = header_value(frame.headers, "WARC-Payload-Digest")
    stats.revisits += 1
    return Page(frame.url, b"", (), frame.date, None, source,
                payload_digest=digest.strip() if digest else None,
                revisit=Revisit(profile, refers, refers_date))


# --- FastWARC, with the lenient reader checking the tail --------------------------------------


class _NotWarc(Exception):
    """FastWARC returned something that is not a sound WARC record (e.g. LF-only headers)."""


def _warc_items(path: Path) -> Iterator[_Frame | Rejected]:
    positions: list[int] = []
    try:
        with open(path, "rb") as fh:
            for record in FastArchiveIterator(fh, parse_http=False):
                frame = _from_fastwarc(record)
                positions.append(record.stream_pos)
                yield frame
    except Exception:  # whatever FastWARC trips on, the lenient reader takes
        pass  # over from the last good record (and reports the damage it finds)
    offset = positions[-1] if positions and _starts_record(path, positions[-1]) else 0
    skip = sum(1 for pos in positions if pos >= offset)
    yield from _lenient_items(path, "warc", offset=offset, skip=skip)


def _from_fastwarc(record: WarcRecord) -> _Frame:
    headers = record.headers
    rec_type = (headers.get("WARC-Type") or "").strip().lower()
    # "unknown" is what FastWARC makes of LF-only headers; our reader knows odd types too.
    if record.record_type == WarcRecordType.unknown or not rec_type.isalpha():
        raise _NotWarc
    if headers.get("Content-Length") is None:  # FastWARC's view of a header cut off by EOF
        raise _NotWarc
    uri, date = _uri(headers.get("WARC-Target-URI")), _warc_date(headers.get("WARC-Date"))
    length, ctype, fields = record.content_length, headers.get("Content-Type"), headers.items()
    block, truncated = None, False
    if rec_type == "response":
        block = record.reader.read(_HEAD)
        got = len(block)
        if got == _HEAD and _wanted(block, ctype):
            block += record.reader.read()
            got = len(block)
        elif got == _HEAD:
            got += record.reader.consume()
        truncated = got < length
    return _Frame(record.stream_pos, rec_type, uri, date, ctype, fields, length, block, truncated)


def _wanted(head: bytes, content_type: str | None) -> bool:
    """Whether a response block is worth reading whole: False only for an HTTP response
    whose headers, complete in `head`, name a non-HTML type (a video need not sit in RAM)."""
    if not looks_like_http(head) or (b"\r\n\r\n" not in head and b"\n\n" not in head):
        return True
    try:
        return is_html(parse_response(head).header("Content-Type") or content_type)
    except PageError:
        return True


def _starts_record(path: Path, offset: int) -> bool:
    with open(path, "rb") as fh:
        fh.seek(offset)
        head = fh.read(5)
    return head.startswith(_GZIP_MAGIC) or head == b"WARC/"


def _uri(value: str | None) -> str | None:
    return value.strip().removeprefix("<").removesuffix(">") if value else None


def _warc_date(value: str | None) -> str | None:
    return value.strip() if value and _ISO_DATE.match(value.strip()) else None


def _arc_date(value: bytes) -> str:
    d = value.decode("ascii").ljust(14, "0")
    return f"{d[:4]}-{d[4:6]}-{d[6:8]}T{d[8:10]}:{d[10:12]}:{d[12:14]}Z"


# --- the lenient reader -------------------------------------------------------------------------


class _Gunzip(io.RawIOBase):
    """Multi-member gzip stream that skips damage instead of stopping at it.

    Damage (corrupt member, junk between members, file ending inside a member) is noted as
    (offset in the decompressed stream, kind, message) so the framer can tell which record
    it hit.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._read_to = raw.tell()  # the file offset just past what `_in` holds
        self._decoder: zlib._Decompress | None = None
        self._in = b""
        self._out = memoryview(b"")
        self._produced = 0
        self._eof = False
        self.damage: list[tuple[int, str, str]] = []
        # (offset in the decompressed stream, file offset) of each member started
        self.members: list[tuple[int, int]] = []

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._out and not self._eof:
            self._step()
        n = min(len(buffer), len(self._out))
        buffer[:n] = self._out[:n]
        self._out = self._out[n:]
        return n

    def _more(self) -> bool:
        data = self._raw.read(_CHUNK)
        self._in += data
        self._read_to += len(data)
        return bool(data)

    def _step(self) -> None:
        if not self._in and not self._more():
            if self._decoder is not None:
                self._emit(self._decoder.flush())
                self._note("truncated", "the gzip stream ends inside a member: file cut short")
            self._eof = True
            return
        if self._decoder is None:
            self._in = self._in.lstrip(b"\x00")  # zero padding after the last member
            if len(self._in) < 3 and self._more():
                return
            if not self._in:
                return
            if not self._in.startswith(_GZIP_MAGIC):
                self._skip("bytes between gzip members that are not gzip data")
                return
            self._decoder = zlib.decompressobj(31)
            self.members.append((self._produced, self._read_to - len(self._in)))
        try:
            self._emit(self._decoder.decompress(self._in, _CHUNK * 16))
        except zlib.error as exc:
            self._decoder = None
            self._skip(f"corrupt gzip member ({exc})")
            return
        if self._decoder.eof:
            self._in = self._decoder.unused_data
            self._decoder = None
        else:
            self._in = self._decoder.unconsumed_tail

    def _skip(self, why: str) -> None:
        skipped = 0
        while (found := self._in.find(_GZIP_MAGIC, 1)) < 0:
            skipped += max(len(self._in) - 2, 0)
            self._in = self._in[-2:]
            if not self._more():
                skipped, self._in = skipped + len(self._in), b""
                break
        else:
            skipped += found
            self._in = self._in[found:]
        self._note("bad-record", f"{why}: skipped {skipped} compressed bytes")

    def _emit(self, data: bytes) -> None:
        self._out = memoryview(data)
        self._produced += len(data)

    def _note(self, kind: str, message: str) -> None:
        self.damage.append((self._produced, kind, message))


class _Cursor:
    """Line and block reads over the decompressed stream, counting the offset."""

    def __init__(self, stream: BinaryIO, pos: int, where: str) -> None:
        self.stream = stream
        self.pos = pos
        self.where = where  # what `pos` counts, for messages

    def line(self) -> bytes:
        data = self.stream.readline(_MAX_LINE)
        self.pos += len(data)
        return data

    def read(self, size: int, keep: bool = True) -> tuple[bytes, int]:
        """Up to `size` bytes (kept only if asked, to skip big non-pages cheaply) and the count."""
        parts: list[bytes] = []
        left = size
        while left > 0 and (data := self.stream.read(min(left, _CHUNK * 16))):
            self.pos += len(data)
            left -= len(data)
            if keep:
                parts.append(data)
        return b"".join(parts), size - left


def _lenient_items(
    path: Path, fmt: ArchiveFormat, offset: int = 0, skip: int = 0,
    members: list[tuple[int, int]] | None = None,
) -> Iterator[_Frame | Rejected]:
    """Frames of the file from `offset` (a record start), the first `skip` records dropped.

    Gzip damage is matched to records by offset: damage inside a record rejects it, damage
    between records is reported on its own. `members` (gzip only) is filled with where each
    gzip member starts: (offset in the decompressed stream, file offset).
    """
    with open(path, "rb") as raw:
        raw.seek(offset)
        gzipped = raw.read(2) == _GZIP_MAGIC[:2]
        raw.seek(offset)
        gunzip = _Gunzip(raw) if gzipped else None
        if gunzip is not None and members is not None:
            gunzip.members = members
        stream = io.BufferedReader(gunzip, _CHUNK) if gunzip else raw
        damage = gunzip.damage if gunzip else []
        where = f"of the data gunzipped from file byte {offset}" if gunzip else "in the file"
        cur = _Cursor(stream, 0 if gunzip else offset, where)
        for item in _frames(cur, fmt):
            is_record = isinstance(item, _Frame)
            if isinstance(item, _Frame) and damage:
                yield from (
                    Rejected(None, kind, msg) for pos, kind, msg in damage if pos <= item.start
                )
                inside = [
                    d
                    for d in damage
                    if item.start < d[0] < cur.pos or (item.truncated and d[0] == cur.pos)
                ]
                damage[:] = [d for d in damage if d[0] >= cur.pos and d not in inside]
                if inside and not item.truncated:
                    item = Rejected(item.url, "bad-record", f"record damaged: {inside[0][2]}")
            if skip and is_record:
                skip -= 1
                continue
            yield item
        yield from (Rejected(None, kind, msg) for _pos, kind, msg in damage)


def _header_fields(cur: _Cursor) -> tuple[Headers, bool]:
    """Header lines up to the blank line; False if the stream ended first."""
    fields: list[tuple[str, str]] = []
    while (line := cur.line()).endswith(b"\n"):  # a line cut off by EOF is not a header
        if not line.strip():
            return tuple(fields), True
        name, sep, value = line.decode("utf-8", "replace").partition(":")
        if sep:
            fields.append((name.strip(), value.strip()))
    return tuple(fields), False


def _resync(cur: _Cursor, line: bytes, is_start: Callable[[bytes], bool]) -> tuple[bytes, int]:
    """Skip lines up to the next record start; returns that line and the bytes skipped."""
    skipped = 0
    while line and not is_start(line):
        skipped += len(line)
        line = cur.line()
    return line, skipped


def _is_warc_start(line: bytes) -> bool:
    return line.startswith(b"WARC/")


def _is_arc_start(line: bytes) -> bool:
    return _arc_header(line) is not None


def _frames(cur: _Cursor, fmt: ArchiveFormat) -> Iterator[_Frame | Rejected]:
    """Records of a WARC or ARC stream; junk and unusable headers become Rejected."""
    is_start = _is_warc_start if fmt == "warc" else _is_arc_start
    line = cur.line()
    while line:
        start = cur.pos - len(line)
        if not line.strip():
            line = cur.line()
            continue
        if not is_start(line):
            line, skipped = _resync(cur, line, is_start)
            msg = f"{skipped} bytes at offset {start} {cur.where} are not a {fmt.upper()} record"
            yield Rejected(None, "bad-record", msg + "; skipped")
            continue
        head = _warc_head(cur) if fmt == "warc" else _arc_header(line)
        if isinstance(head, Rejected):
            line, skipped = _resync(cur, cur.line(), is_start)
            msg = f"{head.message} in the record at offset {start} {cur.where}"
            yield dataclasses.replace(head, message=f"{msg}; skipped {skipped} bytes")
            continue
        assert head is not None  # is_start(line) said so
        rec_type, url, date, content_type, headers, length = head
        keep = rec_type == "response"
        block, got = cur.read(min(max(length, 0), _HEAD), keep)
        if got < length:
            rest, more = cur.read(length - got, keep and _wanted(block, content_type))
            block, got = block + rest, got + more
        truncated = length < 0 or got < length
        yield _Frame(start, rec_type, url, date, content_type, headers, length, block, truncated)
        line = cur.line()


_Head = tuple[str, str | None, str | None, str | None, Headers, int]


def _warc_head(cur: _Cursor) -> _Head | Rejected:
    """The WARC header after its `WARC/x.y` line; length -1 if the stream ends inside it."""
    fields, complete = _header_fields(cur)
    url = _uri(header_value(fields, "WARC-Target-URI"))
    length_text = (header_value(fields, "Content-Length") or "").strip()
    if complete and not (length_text.isascii() and length_text.isdigit()):
        return Rejected(url, "bad-record", f"no valid Content-Length ({length_text!r})")
    rec_type = (header_value(fields, "WARC-Type") or "unknown").strip().lower()
    date = _warc_date(header_value(fields, "WARC-Date"))
    length = int(length_text) if complete else -1
    return rec_type, url, date, header_value(fields, "Content-Type"), fields, length


def _arc_header(line: bytes) -> _Head | None:
    """An ARC v1 or v2 header line (ARC records have no other header), or None."""
    fields = line.split()
    if len(fields) < 5 or not fields[-1].isdigit():
        return None
    if len(fields) == 10 and _ARC_DATE.fullmatch(fields[2]):  # v2: ... checksum location ...
        url, date, mime = fields[0], fields[2], fields[3]
    else:  # v1: `URL IP date mime length`; tolerate spaces inside the URL
        url, date, mime = b" ".join(fields[:-4]), fields[-3], fields[-2]
    if not _ARC_DATE.fullmatch(date) or b":" not in url:
        return None
    text = url.decode("utf-8", "replace")
    rec_type = "warcinfo" if text.startswith("filedesc:") else "response"
    return rec_type, text, _arc_date(date), mime.decode("ascii", "replace"), (), int(fields[-1])
