"""The memory index's document records as columns, not objects (DocArena), and where what
only verification reads goes: an unlinked temporary file written 1 MiB at a time
(_RecordFile), or RAM (_RamRecords).

A StoredDoc per page cost ~1.1 KB of Python objects (bench/memory.py); here a page costs a
fixed row, its two fingerprints and its URL in RAM, and its record (sketch, shingle set,
crawl time, LD signature) on disk by default.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import tempfile
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from stream_dedup.errors import IndexStoreError
from stream_dedup.index.base import StoredDoc
from stream_dedup.index.namespaces import pack_url, unpack_url

_NO_FEATURES = np.zeros(0, np.uint64)
_NO_SKETCH = np.zeros(0, np.uint32)

_SHIFT = 16
_CHUNK, _AT = 1 << _SHIFT, (1 << _SHIFT) - 1  # rows per chunk of a DocArena column; row -> at


class _Column:
    """Fixed-size values in chunks of _CHUNK rows (`width` values a row; 0: one value): a
    growing column is never copied, and a chunk's rows not yet written are not resident."""

    def __init__(self, dtype: type, width: int = 0) -> None:
        self.dtype, self.width = dtype, width
        self.chunks: list[np.ndarray] = []
        self.rows = 0

    def extend(self, values: np.ndarray) -> None:
        done = 0
        while done < len(values):
            at = self.rows % _CHUNK
            if at == 0:
                self.chunks.append(np.empty((_CHUNK, self.width) if self.width else _CHUNK,
                                            self.dtype))
            n = min(len(values) - done, _CHUNK - at)
            self.chunks[-1][at : at + n] = values[done : done + n]
            done += n
            self.rows += n

    def __getitem__(self, row: int) -> Any:
        return self.chunks[row >> _SHIFT][row & _AT]

    @property
    def nbytes(self) -> int:
        return self.rows * np.dtype(self.dtype).itemsize * max(1, self.width)


class _Bytes:
    """Values of any length end to end, a bytearray per chunk of _CHUNK rows; where a row
    ends in its chunk is kept by the caller."""

    def __init__(self) -> None:
        self.chunks: list[bytearray] = []

    def extend(self, first_row: int, values: Sequence[bytes]) -> np.ndarray:
        """Append the values of rows first_row...; where each ends in its chunk."""
        ends = np.empty(len(values), np.uint64)
        for i, value in enumerate(values):
            if (first_row + i) % _CHUNK == 0:
                self.chunks.append(bytearray())
            chunk = self.chunks[-1]
            chunk += value
            ends[i] = len(chunk)
        return ends

    def get(self, row: int, start: int, end: int) -> bytes:
        return bytes(self.chunks[row >> _SHIFT][start:end])

    @property
    def nbytes(self) -> int:
        return sum(len(c) for c in self.chunks)


log = logging.getLogger("stream_dedup")


def records_home(directory: str) -> str:
    """Where the record file goes: `directory`; else $TMPDIR; else /var/tmp, which is on
    disk where /tmp is a tmpfs (Debian 13, Fedora, Arch: the file would take RAM there);
    else the system's temporary directory."""
    if directory:
        return directory
    if os.environ.get("TMPDIR"):
        return os.environ["TMPDIR"]
    if os.access("/var/tmp", os.W_OK | os.X_OK):
        return "/var/tmp"
    return tempfile.gettempdir()


def in_ram(path: str) -> str | None:
    """The type of the file system `path` is on when that lives in RAM (tmpfs, ramfs)."""
    path, best, kind = os.path.realpath(path), "", ""
    try:
        with open("/proc/self/mounts") as fh:
            for line in fh:
                mount, fstype = line.split()[1:3]
                mount = mount.replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fstype
    except (OSError, ValueError):  # not Linux
        return None
    return kind if kind in ("tmpfs", "ramfs") else None


class _RecordFile:
    """Byte strings of any length end to end in a temporary file, unlinked from the start
    (nothing is left behind, also after a crash; its pages are the kernel's page cache, not
    this process's memory). Writes go out in pieces of at least _WRITE_BEHIND bytes: the
    rows' records wait (their parts, not copied; a read of one is served from there) until
    that much waits, then one pwritev writes them and the call's records straight from
    their parts (no copy in this process). A write a page (`check`, one page at a time)
    cost ~13 µs for ~10 KB (~20 µs a page before the shingle sets). A read is one pread.
    Where each row ends: a column in RAM (8 bytes a row)."""

    def __init__(self, directory: str) -> None:
        where = records_home(directory)
        try:
            self._file = tempfile.TemporaryFile(dir=where, prefix="stream-dedup-records-",
                                                buffering=0)
        except OSError as exc:
            raise IndexStoreError(
                f"cannot make the memory index's record file in {where}: {exc} (choose "
                f"another directory with --memory-records-dir, or --memory-records ram)"
            ) from exc
        if kind := in_ram(where):
            log.warning("the memory index's record file is in %s, a %s: it takes RAM there, "
                        "not disk (~640 bytes + 4 a shingle a kept page: ~5 KB for a mean "
                        "web page); give a directory on disk with --memory-records-dir", where,
                        kind)
        self._fd = self._file.fileno()
        # An index nobody closes (a library user's) closes its file when it is collected.
        self.close = weakref.finalize(self, self._file.close)
        self._where = where
        self._written = 0  # bytes of whole rows in the file
        self._pending: list[Sequence[bytes]] = []  # the last rows' records, not written yet
        self._pending_bytes = 0
        self.ends = _Column(np.uint64)

    def extend(self, records: Sequence[Sequence[bytes]]) -> None:
        """Append one record per row, each given as its parts; all or nothing (a full disk
        raises, no row added, the rows waiting stay in the buffer; the next call writes
        over what it left)."""
        ends = np.cumsum(np.array([sum(map(len, r)) for r in records], np.uint64))
        size = int(ends[-1]) if len(records) else 0
        start = self._written + self._pending_bytes
        if self._pending_bytes + size >= _WRITE_BEHIND:  # out with what waits, in one write
            self._write([memoryview(p) for rs in (self._pending, records) for r in rs
                         for p in r if p], self._written)
            self._written, self._pending, self._pending_bytes = start + size, [], 0
        else:
            self._pending += records
            self._pending_bytes += size
        self.ends.extend(ends + np.uint64(start))

    def _write(self, views: list[memoryview], offset: int) -> None:
        try:
            _pwrite_all(self._fd, views, offset)
        except OSError as exc:
            raise IndexStoreError(
                f"cannot write the memory index's record file in {self._where}: {exc} "
                f"(free space there, choose another directory with --memory-records-dir, "
                f"or keep the records in RAM with --memory-records ram)") from exc

    def get(self, row: int) -> bytes:
        waiting = row - (self.ends.rows - len(self._pending))
        if waiting >= 0:
            return b"".join(self._pending[waiting])
        start = int(self.ends[row - 1]) if row else 0
        return os.pread(self._fd, int(self.ends[row]) - start, start)

    @property
    def nbytes(self) -> int:
        return self._written + self._pending_bytes


# Bytes of records written at once: a write a page cost more than the page's other work.
_WRITE_BEHIND = 1 << 20


_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16


def _pwrite_all(fd: int, views: list[memoryview], offset: int) -> None:
    """Write every view at `offset` on, in order: pwritev calls of at most _IOV_MAX views,
    again after a short write."""
    at = 0
    while at < len(views):
        n = os.pwritev(fd, views[at : at + _IOV_MAX], offset)
        if n <= 0:
            raise OSError(errno.ENOSPC, "the record file takes no more bytes")
        offset += n
        while n:
            if n < len(views[at]):
                views[at], n = views[at][n:], 0
            else:
                n -= len(views[at])
                at += 1


class _RamRecords:
    """_RecordFile's interface in RAM: a bytearray per chunk of _CHUNK rows, and where each
    row ends in its chunk, a column of 8 bytes a row (with their shingle sets, a chunk's
    records can pass 4 GiB)."""

    def __init__(self) -> None:
        self._bytes = _Bytes()
        self.ends = _Column(np.uint64)

    def extend(self, records: Sequence[Sequence[bytes]]) -> None:
        """Append one record per row, each given as its parts."""
        self.ends.extend(self._bytes.extend(self.ends.rows, [b"".join(r) for r in records]))

    def get(self, row: int) -> bytes:
        start = int(self.ends[row - 1]) if row & _AT else 0
        return self._bytes.get(row, start, int(self.ends[row]))

    @property
    def nbytes(self) -> int:
        return self._bytes.nbytes

    def close(self) -> None:
        pass


_U32 = struct.Struct("<I")
# A DocArena row's fixed part: one structured value, read in one step.
_ROW = np.dtype([("id_high", "<u8"), ("id_low", "<u8"), ("text_length", "<u4"),
                 ("url_end", "<u4"), ("sketched", "?")])


def _fetched(fetched_at: str | None) -> bytes:
    """A crawl time in a record: its length (a byte), then its UTF-8 (at most 255 bytes)."""
    raw = (fetched_at or "").encode("utf-8", "replace")[:255]
    return bytes((len(raw),)) + raw


class DocArena:
    """Kept pages' records as columns, not objects: per page, its two fingerprints, a fixed
    row (id, text length, where its URL ends) and its URL in RAM; what only verification
    reads, its sketch (4 bytes a min-hash), its shingle set (a u32 length, then 4 bytes a
    shingle), its crawl time (a length byte, then UTF-8) and its LD signature, as one byte
    string in a _RecordFile on disk (`records_dir`: where), or with `records_dir` None in
    _RamRecords, end to end in RAM (each keeps where a row ends: 8 bytes a row). A
    StoredDoc per page cost ~1.1 KB of Python objects (bench/memory.py). Reading a row
    builds its StoredDoc (what verification reads; the page's features live in the index,
    not here)."""

    def __init__(self, records_dir: str | None = None) -> None:
        self._rows = _Column(_ROW)
        # raw, canonical: their top 32 bits (the exact layers' keys are the low 32 bits, so
        # a key's hit and these make the whole fingerprint)
        self._fps = _Column(np.uint32, 2)
        self._urls = _Bytes()
        self._records = _RamRecords() if records_dir is None else _RecordFile(records_dir)
        self._width = 0  # min-hashes a sketch: the first sketch stored says

    def __len__(self) -> int:
        return self._rows.rows

    def extend(self, docs: Sequence[StoredDoc]) -> None:
        if not docs:
            return
        first = len(self)
        widths = {d.sketch.shape[0] for d in docs} - {0}
        if not self._width and widths:
            self._width = min(widths)
        if widths - {self._width}:
            raise ValueError(f"sketches of {sorted(widths)} values in an index of "
                             f"{self._width}")
        records = [(d.sketch.astype("<u4").tobytes(), _U32.pack(len(d.shingles)), d.shingles,
                    _fetched(d.fetched_at), d.ld_signature) for d in docs]
        rows = np.empty(len(docs), _ROW)
        self._records.extend(records)  # first: a write that fails leaves the arena as it was
        rows["url_end"] = self._urls.extend(first, [pack_url(d.namespace, d.url)
                                                    for d in docs])
        self._fps.extend(np.array([(d.raw_fp >> 32, d.canonical_fp >> 32) for d in docs],
                                  np.uint32))
        for name, values in (
                ("id_high", [d.page_id >> 64 for d in docs]),
                ("id_low", [d.page_id & 0xFFFFFFFFFFFFFFFF for d in docs]),
                ("text_length", [d.text_length for d in docs]),
                ("sketched", [d.sketch.shape[0] > 0 for d in docs])):
            rows[name] = values
        self._rows.extend(rows)

    def url_field(self, row: int) -> bytes:
        """The row's URL as stored, naming its namespace (namespaces.unpack_url)."""
        chunk, at = self._rows.chunks[row >> _SHIFT], row & _AT
        start = chunk[at - 1].item()[3] if at else 0
        return self._urls.get(row, start, chunk[at].item()[3])

    def url_fields(self, first: int, end: int) -> list[bytes]:
        """url_field of rows first...end - 1, a chunk at a time."""
        out: list[bytes] = []
        row = first
        while row < end:
            c, at = row >> _SHIFT, row & _AT
            stop = min(end - (c << _SHIFT), _CHUNK)
            ends = self._rows.chunks[c]["url_end"][max(0, at - 1) : stop].tolist()
            if at == 0:
                ends.insert(0, 0)
            chunk = self._urls.chunks[c]
            out += [bytes(chunk[a:b]) for a, b in zip(ends, ends[1:], strict=False)]
            row = (c << _SHIFT) + stop
        return out

    def url(self, row: int) -> str:
        return unpack_url(self.url_field(row))[1]

    def page_id(self, row: int) -> int:
        high, low = self._rows[row].item()[:2]
        return int(high << 64 | low)

    def rows_of(self, page_ids: Sequence[int]) -> list[int]:
        """The rows holding these page ids (a pass over the id columns, ~1 ms a million)."""
        if not page_ids:
            return []
        low = np.array([i & 0xFFFFFFFFFFFFFFFF for i in page_ids], np.uint64)
        wanted = set(page_ids)
        out = []
        for c, chunk in enumerate(self._rows.chunks):
            used = chunk[: min(_CHUNK, self._rows.rows - (c << _SHIFT))]
            for at in np.flatnonzero(np.isin(used["id_low"], low)).tolist():
                high, low_id = used[at].item()[:2]
                if high << 64 | low_id in wanted:
                    out.append(c << _SHIFT | at)
        return out

    def fingerprint_high(self, row: int, layer: int) -> int:
        """The top 32 bits of the row's RAW or CANONICAL fingerprint."""
        return int(self._fps.chunks[row >> _SHIFT][row & _AT, layer])

    def __getitem__(self, row: int) -> StoredDoc:
        if not 0 <= row < len(self):
            raise IndexError(row)
        chunk, at = self._rows.chunks[row >> _SHIFT], row & _AT
        high, low, text_length, url_end, sketched = chunk[at].item()
        url_start = chunk[at - 1].item()[3] if at else 0
        raw_fp, canonical_fp = (high << 32 for high in self._fps.chunks[row >> _SHIFT][at].tolist())
        record = self._records.get(row)
        split = 4 * self._width if sketched else 0
        sketch = np.frombuffer(record, "<u4", split // 4).astype(np.uint32) if sketched \
            else _NO_SKETCH
        tops_end = split + 4 + _U32.unpack_from(record, split)[0]
        sig_start = tops_end + 1 + record[tops_end]
        fetched_at = record[tops_end + 1 : sig_start].decode("utf-8", "replace") or None
        namespace, url = unpack_url(self._urls.get(row, url_start, url_end))
        return StoredDoc(url, _NO_FEATURES, sketch, record[sig_start:], text_length, raw_fp,
                         canonical_fp, fetched_at, high << 64 | low, record[split + 4 : tops_end],
                         namespace=namespace)

    def close(self) -> None:
        self._records.close()

    @property
    def nbytes(self) -> dict[str, int]:
        """Bytes of RAM held per part (written rows: a chunk's unwritten rows are not
        resident), and `on_disk`: the record file's."""
        on_disk = isinstance(self._records, _RecordFile)
        return {"fixed": self._rows.nbytes + self._fps.nbytes + self._records.ends.nbytes,
                "records (sketch, shingles, LD)": 0 if on_disk else self._records.nbytes,
                "url": self._urls.nbytes, "on_disk": self._records.nbytes if on_disk else 0}
