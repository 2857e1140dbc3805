"""In-memory index: sorted numpy runs instead of a dict per key.

A Python dict costs ~130 bytes per key; six features per page would cost ~800 bytes per
page. Here a (key, page id) pair costs 8 bytes: new pairs go to a small dict (the
memtable); when it fills it is sorted into a run of two numpy arrays (uint32 keys, uint32
ids), and runs of similar size are merged, as in an LSM tree, so a lookup searches a few
sorted runs (np.searchsorted on all k features at once). Merging is also where posting
lists are capped: a feature keeps only its `cap` most recent pages (or, for the exact
layers, its first pages).

Keys are the low 32 bits of the 64-bit index keys (features, band keys) and fingerprints
(uniform hash outputs). For index keys a chance match costs nothing: a candidate is
verified before it drops a page (or, unsampled, needs r shared features). For the exact
layers, where a match drops a page unverified, every hit is confirmed against the full
64-bit fingerprint in the page's document record. 6 features + 5 band keys + 2 fingerprints
= 104 bytes a page.

The document records are columns too (DocArena): a fixed row, the fingerprints and the URL
in RAM (~130 bytes a page), and what only verification reads, the sketch, the shingle set
and the LD signature (~640 bytes + 4 a shingle up to 8,192), in an unlinked temporary file by
default (read back with one pread per candidate verified, a few per page that has
candidates; `memory_records = "ram"` keeps them in RAM instead).
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import tempfile
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.urls import UrlKeys
from ..errors import IndexMismatchError, IndexStoreError
from .base import CANONICAL, RAW, Claim, Docs, LocalIndex, Plan, StoredDoc

try:
    from ..core import _native
except ImportError:  # installed without a C compiler: numpy searches the runs
    _native = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from .lsm import LsmIndex

_MEMTABLE_MAX = 8192
_NO_FEATURES = np.zeros(0, np.uint64)
_NO_SKETCH = np.zeros(0, np.uint32)
_GONE = StoredDoc("", _NO_FEATURES, _NO_SKETCH, b"", 0, 0, 0)


_KEY_MASK = 0xFFFFFFFF


class SortedRunMultimap:
    """64-bit key (stored as its low 32 bits) -> page ids (uint32), ascending ids per key,
    capped per key."""

    def __init__(self, cap: int, keep: str = "last",
                 dead: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        if keep not in ("first", "last"):
            raise ValueError("keep must be 'first' or 'last'")
        self.cap = cap
        self.keep = keep
        # Which values are gone (a bool mask of a uint32 array): dropped when runs are made
        # and merged, so removed pages cost nothing once their entries reach a merge.
        self.dead = dead
        # key -> its one value, or a list of them (oldest first): most keys are seen once,
        # and an int is no container for the garbage collector to track.
        self._mem: dict[int, int | list[int]] = {}
        self._mem_entries = 0
        self._runs: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, key: int, value: int) -> None:
        self.add_many(key, value)

    def add_many(self, keys: np.ndarray | int, value: int) -> None:
        """`value` under each key (uint64 array, or one int; one call for all of a page's
        features)."""
        first = self.keep == "first"
        if _native is not None:
            if not isinstance(keys, int):
                keys = np.ascontiguousarray(keys, dtype=np.uint64)
            self._mem_entries += _native.memtable_add(self._mem, keys, value, self.cap, first)
        else:
            for key in [keys] if isinstance(keys, int) else keys.tolist():
                self._put(key & _KEY_MASK, value, first)
        if self._mem_entries >= _MEMTABLE_MAX:
            self.flush()

    def _put(self, key: int, value: int, first: bool) -> None:
        """memtable_add's rules for one key, in Python (no compiled kernels)."""
        old = self._mem.get(key)
        if old is None:
            self._mem[key] = value
            self._mem_entries += 1
        elif isinstance(old, list):
            if first and len(old) >= self.cap:
                return
            old.append(value)
            if not first and len(old) > self.cap:
                del old[0]
            else:
                self._mem_entries += 1
        elif self.cap < 2:
            if not first:
                self._mem[key] = value
        else:
            self._mem[key] = [old, value]
            self._mem_entries += 1

    def _mem_values(self, key: int) -> list[int]:
        bucket = self._mem.get(key)
        if bucket is None:
            return []
        return bucket if isinstance(bucket, list) else [bucket]

    def get_many(self, keys: np.ndarray) -> list[int]:
        """All stored values of all keys (uint64; a value may repeat across keys)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if _native is not None:  # one call for every run and the memtable
            return _native.multimap_get(self._runs, self._mem, keys, self.cap)
        out: list[int] = []
        low = (keys & np.uint64(_KEY_MASK)).astype(np.uint32)
        for run_keys, run_vals in self._runs:
            lo = np.searchsorted(run_keys, low, side="left")
            hi = np.searchsorted(run_keys, low, side="right")
            for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
                if b > a:
                    out += run_vals[max(a, b - self.cap) : b].tolist()
        for key in low.tolist():
            out += self._mem_values(key)
        return out

    def postings(self, keys: np.ndarray) -> list[list[int]]:
        """Each key's `cap` largest values (the most recent pages), a list per key. (Each
        run and the memtable are capped on their own, so a key may hold more.)"""
        cap = self.cap
        if _native is not None:  # one call for every key, capped there
            return _native.multimap_get(self._runs, self._mem,
                                        np.ascontiguousarray(keys, dtype=np.uint64), cap, True)
        got = [self.get_many(np.array([key], dtype=np.uint64)) for key in keys.tolist()]
        return [v if len(v) <= cap else sorted(v)[-cap:] for v in got]

    def values(self, key: int) -> list[int]:
        """The stored values of one key, ascending (older runs hold older ids)."""
        if _native is not None:  # no array built for one key
            return sorted(_native.multimap_get(self._runs, self._mem, key, self.cap))
        return sorted(self.get_many(np.array([key & _KEY_MASK], dtype=np.uint64)))

    def flush(self) -> None:
        if not self._mem:
            return
        if _native is not None:
            kb, vb = _native.memtable_arrays(self._mem, self._mem_entries)
            keys, vals = np.frombuffer(kb, dtype=np.uint32), np.frombuffer(vb, dtype=np.uint32)
        else:
            n = self._mem_entries
            keys = np.fromiter((k for k in self._mem for _ in self._mem_values(k)), np.uint32, n)
            vals = np.fromiter((v for k in self._mem for v in self._mem_values(k)), np.uint32, n)
        self._mem.clear()
        self._mem_entries = 0
        if self.dead is not None:
            alive = ~self.dead(vals)
            keys, vals = keys[alive], vals[alive]
        order = np.argsort(keys, kind="stable")
        self._runs.append((keys[order], vals[order]))
        while len(self._runs) >= 2 and self._runs[-1][0].shape[0] * 4 >= self._runs[-2][0].shape[0]:
            newer = self._runs.pop()
            older = self._runs.pop()
            self._runs.append(self._merge(older, newer))

    def _merge(
        self, older: tuple[np.ndarray, np.ndarray], newer: tuple[np.ndarray, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        keys = np.concatenate((older[0], newer[0]))
        vals = np.concatenate((older[1], newer[1]))
        if self.dead is not None:
            alive = ~self.dead(vals)
            keys, vals = keys[alive], vals[alive]
        order = np.argsort(keys, kind="stable")  # stable: older ids stay before newer ones
        keys, vals = keys[order], vals[order]
        if keys.shape[0] == 0:
            return keys, vals
        starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
        lengths = np.diff(np.append(starts, keys.shape[0]))
        rank = np.arange(keys.shape[0]) - np.repeat(starts, lengths)
        if self.keep == "first":
            keep = rank < self.cap
        else:
            keep = rank >= np.repeat(lengths, lengths) - self.cap
        return keys[keep], vals[keep]

    def __len__(self) -> int:
        return self._mem_entries + sum(int(k.shape[0]) for k, _ in self._runs)

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self._runs) + self._mem_entries * 12


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
        self._fps = _Column(np.uint64, 2)  # raw, canonical: the exact layers read them most
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
        rows["url_end"] = self._urls.extend(first, [d.url.encode("utf-8", "surrogatepass")
                                                    for d in docs])
        self._fps.extend(np.array([(d.raw_fp, d.canonical_fp) for d in docs], np.uint64))
        for name, values in (
                ("id_high", [d.page_id >> 64 for d in docs]),
                ("id_low", [d.page_id & 0xFFFFFFFFFFFFFFFF for d in docs]),
                ("text_length", [d.text_length for d in docs]),
                ("sketched", [d.sketch.shape[0] > 0 for d in docs])):
            rows[name] = values
        self._rows.extend(rows)

    def url(self, row: int) -> str:
        chunk, at = self._rows.chunks[row >> _SHIFT], row & _AT
        start = chunk[at - 1].item()[3] if at else 0
        return self._urls.get(row, start, chunk[at].item()[3]).decode("utf-8", "surrogatepass")

    def fingerprint(self, row: int, layer: int) -> int:
        """The row's RAW or CANONICAL fingerprint."""
        return int(self._fps.chunks[row >> _SHIFT][row & _AT, layer])

    def __getitem__(self, row: int) -> StoredDoc:
        if not 0 <= row < len(self):
            raise IndexError(row)
        chunk, at = self._rows.chunks[row >> _SHIFT], row & _AT
        high, low, text_length, url_end, sketched = chunk[at].item()
        url_start = chunk[at - 1].item()[3] if at else 0
        raw_fp, canonical_fp = self._fps.chunks[row >> _SHIFT][at].tolist()
        record = self._records.get(row)
        split = 4 * self._width if sketched else 0
        sketch = np.frombuffer(record, "<u4", split // 4).astype(np.uint32) if sketched \
            else _NO_SKETCH
        tops_end = split + 4 + _U32.unpack_from(record, split)[0]
        sig_start = tops_end + 1 + record[tops_end]
        fetched_at = record[tops_end + 1 : sig_start].decode("utf-8", "replace") or None
        url = self._urls.get(row, url_start, url_end).decode("utf-8", "surrogatepass")
        return StoredDoc(url, _NO_FEATURES, sketch, record[sig_start:], text_length, raw_fp,
                         canonical_fp, fetched_at, high << 64 | low, record[split + 4 : tops_end])

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


class MemoryIndex(LocalIndex):
    """The default backend. Holds everything in this process, and what only verification
    reads in an unlinked temporary file in `records_dir` ("": records_home's choice; None:
    in RAM too); gone when it exits.

    URLs: a map url key -> rows (one more 8-byte entry a page; a hit is confirmed against
    `url_key(url)` of the row's stored URL), and a bit a row for the versions a newer one
    replaced. A replaced version's index keys and fingerprints are skipped by lookups and
    dropped at the next flush or merge that meets them; its row (~60 bytes and its URL)
    and its record stay, unused."""

    def __init__(self, stamp: int, max_posting: int = 64, records_dir: str | None = "",
                 url_key: Callable[[str], int] | None = None) -> None:
        self.stamp = stamp
        self.cap = max_posting
        self._next_local = 0
        dead = self._dead_mask
        self._features = SortedRunMultimap(cap=max_posting, keep="last", dead=dead)
        # Two pages per key: a 32-bit key shared by two fingerprints still finds both. The
        # most recent two: one page holds a fingerprint at a time (a later one is dropped,
        # or, once it is replaced, takes its place).
        self._exact = (SortedRunMultimap(2, "last", dead), SortedRunMultimap(2, "last", dead))
        self._urls = SortedRunMultimap(2, "last", dead)
        self._url_key = url_key or UrlKeys().key
        self._retired = bytearray()  # a bit a row: replaced by a newer version of its URL
        self._n_retired = 0
        self._docs = DocArena(records_dir)
        self._offsets: dict[str, int] = {}

    def check_stamp(self, stamp: int) -> None:
        if stamp != self.stamp:
            raise IndexMismatchError(
                f"index was built with sketch parameters {self.stamp:#x}, not {stamp:#x}"
            )

    def __len__(self) -> int:
        return len(self._docs) - self._n_retired

    def records(self) -> Docs:
        return self._docs

    def _gone(self, row: int) -> int:
        return self._retired[row >> 3] >> (row & 7) & 1

    def _dead_mask(self, rows: np.ndarray) -> np.ndarray:
        if not self._n_retired:
            return np.zeros(rows.shape[0], bool)
        bits = np.frombuffer(bytes(self._retired), np.uint8)
        return (bits[rows >> 3] >> (rows & 7) & 1).astype(bool)

    def postings(self, features: np.ndarray) -> list[list[int]]:
        lists = self._features.postings(features)
        if self._n_retired:
            gone = self._gone
            return [[r for r in rows if not gone(r)] for rows in lists]
        return lists

    def first_with(self, layer: int, fingerprint: int) -> int | None:
        """The first row with this RAW or CANONICAL fingerprint (32-bit keys: confirmed
        against the record's full fingerprint)."""
        for row in self._exact[layer].values(fingerprint):
            if self._docs.fingerprint(row, layer) == fingerprint and not (
                    self._n_retired and self._gone(row)):
                return row
        return None

    def version_of(self, url_key: int) -> int | None:
        for row in reversed(self._urls.values(url_key)):
            if not self._gone(row) and self._url_key(self._docs.url(row)) == url_key:
                return row
        return None

    def retire(self, row: int) -> None:
        if not self._gone(row):
            self._retired[row >> 3] |= 1 << (row & 7)
            self._n_retired += 1

    def insert(self, doc: StoredDoc) -> int:
        """Store a kept page; its row."""
        self._extend([doc])
        return len(self._docs) - 1

    def claim(self, claims: Sequence[Claim]) -> list[bool]:
        first = len(self._docs)
        kept = [c for c in claims if c.doc is not None]
        self._extend([c.doc for c in kept if c.doc is not None])
        if any(c.replaces is not None or c.replaces_claim is not None for c in kept):
            rows = {}
            for i, c in enumerate(claims):
                if c.doc is not None:
                    rows[i] = first + len(rows)
                    replaced = (rows[c.replaces_claim] if c.replaces_claim is not None
                                else c.replaces)
                    if replaced is not None:
                        self.retire(replaced)
        return [True] * len(claims)

    def _extend(self, docs: list[StoredDoc]) -> None:
        row = len(self._docs)
        self._docs.extend(docs)
        need = (len(self._docs) + 7) >> 3
        if len(self._retired) < need:
            self._retired.extend(bytes(need - len(self._retired) + 4096))
        for doc in docs:
            self._features.add_many(doc.features, row)
            self._exact[RAW].add(doc.raw_fp, row)
            if doc.text_length > 0:
                self._exact[CANONICAL].add(doc.canonical_fp, row)
            if doc.url_key:
                self._urls.add(doc.url_key, row)
            row += 1

    def doc(self, row: int) -> StoredDoc:
        return self._docs[row]

    def commit(self, offsets: Mapping[str, int] | None = None) -> None:
        self._offsets.update(offsets or {})

    def offsets(self) -> dict[str, int]:
        return dict(self._offsets)

    def begin(self, plan: Plan) -> None:
        pass  # nothing of this index outlives the process, so nothing is decided again

    def inflight(self) -> Plan | None:
        return None

    def close(self) -> None:
        self._docs.close()

    @classmethod
    def warm_from(cls, lsm: LsmIndex, records_dir: str | None = "",
                  url_key: Callable[[str], int] | None = None) -> MemoryIndex:
        """A memory index holding every committed page of an LSM index (same rows)."""
        index = cls(lsm.stamp, lsm.max_posting, records_dir, url_key)
        for row, doc in lsm.stored_docs():
            if len(index._docs) < row:  # rows of expired or replaced pages stay unused
                gap = row - len(index._docs)
                index._extend([_GONE] * gap)
                for unused in range(row - gap, row):
                    index.retire(unused)
            if not doc.url_key:
                doc.url_key = index._url_key(doc.url)
            index.insert(doc)
        index._offsets = lsm.offsets()
        index._next_local = lsm.local_ids(0).start
        return index

    def stats(self) -> dict[str, float]:
        pages = len(self)
        index_bytes = (self._features.nbytes() + sum(m.nbytes() for m in self._exact)
                       + self._urls.nbytes() + len(self._retired))
        return {
            "pages": pages,
            "feature_entries": len(self._features),
            "index_bytes": index_bytes,
            "index_bytes_per_page": index_bytes / pages if pages else 0.0,
            "doc_store_bytes": sum(v for k, v in self._docs.nbytes.items() if k != "on_disk"),
            "doc_file_bytes": self._docs.nbytes["on_disk"],
        }
