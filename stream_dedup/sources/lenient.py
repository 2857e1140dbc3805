"""The lenient reader of WARC and ARC streams: gzip member by member, skipping damaged
members and non-gzip junk to the next member; any `WARC/x.y` and LF-only line ends;
resynchronised on the next record header after garbage or a wrong Content-Length. ARC files
always come this way (FastWARC reads none, and warcio rejects Common Crawl's 2008 ARC v1:
no blank line between records); WARC files after FastWARC stops (fastwarc_reader.py); a
Kafka message's record always (warc_message.py).

Damage never raises: it becomes a Rejected, matched to the record it hit by offset.
"""

from __future__ import annotations

import dataclasses
import io
import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from stream_dedup.models import Rejected
from stream_dedup.sources.archive_record import (
    GZIP_MAGIC,
    HEAD,
    PAGE_TYPES,
    ArchiveFormat,
    Frame,
    arc_date,
    uri,
    wanted,
    warc_date,
)
from stream_dedup.sources.http_response import Headers, header_value

_CHUNK = 1 << 16
_MAX_LINE = 1 << 16
_ARC_DATE = re.compile(rb"\d{12,14}")


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
            if not self._in.startswith(GZIP_MAGIC):
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
        while (found := self._in.find(GZIP_MAGIC, 1)) < 0:
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


class Cursor:
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


def lenient_items(
    path: Path, fmt: ArchiveFormat, offset: int = 0, skip: int = 0,
    members: list[tuple[int, int]] | None = None,
) -> Iterator[Frame | Rejected]:
    """Frames of the file from `offset` (a record start), the first `skip` records dropped.

    Gzip damage is matched to records by offset: damage inside a record rejects it, damage
    between records is reported on its own. `members` (gzip only) is filled with where each
    gzip member starts: (offset in the decompressed stream, file offset).
    """
    with open(path, "rb") as raw:
        raw.seek(offset)
        gzipped = raw.read(2) == GZIP_MAGIC[:2]
        raw.seek(offset)
        gunzip = _Gunzip(raw) if gzipped else None
        if gunzip is not None and members is not None:
            gunzip.members = members
        stream = io.BufferedReader(gunzip, _CHUNK) if gunzip else raw
        damage = gunzip.damage if gunzip else []
        where = f"of the data gunzipped from file byte {offset}" if gunzip else "in the file"
        cur = Cursor(stream, 0 if gunzip else offset, where)
        for item in frames(cur, fmt):
            is_record = isinstance(item, Frame)
            if isinstance(item, Frame) and damage:
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


def _header_fields(cur: Cursor) -> tuple[Headers, bool]:
    """Header lines up to the blank line; False if the stream ended first."""
    fields: list[tuple[str, str]] = []
    while (line := cur.line()).endswith(b"\n"):  # a line cut off by EOF is not a header
        if not line.strip():
            return tuple(fields), True
        name, sep, value = line.decode("utf-8", "replace").partition(":")
        if sep:
            fields.append((name.strip(), value.strip()))
    return tuple(fields), False


def _resync(cur: Cursor, line: bytes, is_start: Callable[[bytes], bool]) -> tuple[bytes, int]:
    """Skip lines up to the next record start; returns that line and the bytes skipped."""
    skipped = 0
    while line and not is_start(line):
        skipped += len(line)
        line = cur.line()
    return line, skipped


def _is_warc_start(line: bytes) -> bool:
    return line.startswith(b"WARC/")


def _is_arc_start(line: bytes) -> bool:
    return arc_header(line) is not None


def frames(cur: Cursor, fmt: ArchiveFormat) -> Iterator[Frame | Rejected]:
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
        head = _warc_head(cur) if fmt == "warc" else arc_header(line)
        if isinstance(head, Rejected):
            line, skipped = _resync(cur, cur.line(), is_start)
            msg = f"{head.message} in the record at offset {start} {cur.where}"
            yield dataclasses.replace(head, message=f"{msg}; skipped {skipped} bytes")
            continue
        assert head is not None  # is_start(line) said so
        rec_type, url, date, content_type, headers, length = head
        keep = rec_type in PAGE_TYPES
        block, got = cur.read(min(max(length, 0), HEAD), keep)
        if got < length:
            rest, more = cur.read(length - got, keep and wanted(block, content_type))
            block, got = block + rest, got + more
        truncated = length < 0 or got < length
        yield Frame(start, rec_type, url, date, content_type, headers, length, block, truncated)
        line = cur.line()


_Head = tuple[str, str | None, str | None, str | None, Headers, int]


def _warc_head(cur: Cursor) -> _Head | Rejected:
    """The WARC header after its `WARC/x.y` line; length -1 if the stream ends inside it."""
    fields, complete = _header_fields(cur)
    url = uri(header_value(fields, "WARC-Target-URI"))
    length_text = (header_value(fields, "Content-Length") or "").strip()
    if complete and not (length_text.isascii() and length_text.isdigit()):
        return Rejected(url, "bad-record", f"no valid Content-Length ({length_text!r})")
    rec_type = (header_value(fields, "WARC-Type") or "unknown").strip().lower()
    date = warc_date(header_value(fields, "WARC-Date"))
    length = int(length_text) if complete else -1
    return rec_type, url, date, header_value(fields, "Content-Type"), fields, length


def arc_header(line: bytes) -> _Head | None:
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
    return rec_type, text, arc_date(date), mime.decode("ascii", "replace"), (), int(fields[-1])
