"""In-memory index: sorted numpy runs instead of a dict per key.

A Python dict costs ~130 bytes per key; six features per page would cost ~800 bytes per
page. Here a (key, page id) pair costs 8 bytes: new pairs go to a small dict (the
memtable); when it fills it is sorted into a run of two numpy arrays (uint32 keys, uint32
ids), and runs of similar size are merged, as in an LSM tree, so a lookup searches a few
sorted runs (np.searchsorted on all k features at once; a large run in a memory mapping of
its own, merged a step at a time without a second copy: runs.py). Merging is also where posting
lists are capped: a feature keeps only its `cap` most recent pages (the exact layers and
the URL map: two), and where the entries of pages a newer version of their URL replaced
are dropped.

Keys are the low 32 bits of the 64-bit index keys (features, band keys) and fingerprints
(uniform hash outputs). For index keys a chance match costs nothing: a candidate is
verified before it drops a page (or, unsampled, needs r shared features). For the exact
layers, where a match drops a page unverified, every hit is confirmed against the full
64-bit fingerprint in the page's document record. 6 features + 5 band keys + 2 fingerprints
+ the URL's key = 112 bytes a page.

The document records are columns too (arena.py's DocArena): a fixed row, the fingerprints
and the URL in RAM (~130 bytes a page), and what only verification reads, the sketch, the
shingle set, the crawl time and the LD signature (~640 bytes + 4 a shingle up to 8,192), in
an unlinked temporary file by default (read back with one pread per candidate verified, a
few per page that has candidates; `memory_records = "ram"` keeps them in RAM instead).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from stream_dedup.core import native as _native  # None: numpy searches the runs
from stream_dedup.core.urls import UrlKeys
from stream_dedup.errors import IndexMismatchError
from stream_dedup.index import runs
from stream_dedup.index.arena import DocArena, records_home
from stream_dedup.index.base import CANONICAL, RAW, Claim, Docs, LocalIndex, Plan, StoredDoc
from stream_dedup.index.deep import NO_DEEP_KEYS, DeepKeys, DeepLayout
from stream_dedup.index.local_forget import Timeline, selected_rows
from stream_dedup.index.namespaces import Forget, salt, unpack_url

if TYPE_CHECKING:
    from stream_dedup.index.lsm import LsmIndex

_MEMTABLE_MAX = 8192
_NO_FEATURES = np.zeros(0, np.uint64)
_NO_SKETCH = np.zeros(0, np.uint32)
_GONE = StoredDoc("", _NO_FEATURES, _NO_SKETCH, b"", 0, 0, 0)


_KEY_MASK = 0xFFFFFFFF


class SortedRunMultimap:
    """64-bit key (stored as its low 32 bits) -> page ids (uint32), ascending ids per key,
    capped per key."""

    def __init__(self, cap: int, keep: str = "last",
                 dead: Callable[[np.ndarray], np.ndarray | None] | None = None) -> None:
        if keep not in ("first", "last"):
            raise ValueError("keep must be 'first' or 'last'")
        self.cap = cap
        self.keep = keep
        # Which values are gone (a bool mask of a uint32 array; None: none is): dropped when
        # runs are made and merged, so removed pages cost nothing once their entries reach a
        # merge.
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
        gone = None if self.dead is None else self.dead(vals)
        if gone is not None:
            keys, vals = keys[~gone], vals[~gone]
        order = np.argsort(keys, kind="stable")
        self._runs.append((keys[order], vals[order]))
        while len(self._runs) >= 2 and self._runs[-1][0].shape[0] * 4 >= self._runs[-2][0].shape[0]:
            newer = self._runs.pop()
            older = self._runs.pop()
            self._runs.append(self._merge(older, newer))

    def _merge(
        self, older: tuple[np.ndarray, np.ndarray], newer: tuple[np.ndarray, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        # a step at a time into a mapping of its own, the inputs' pages given back as they
        # are read (runs.py): the largest merge no longer doubles the table
        return runs.merge(older, newer, self.cap, self.keep, self.dead)

    def __len__(self) -> int:
        return self._mem_entries + sum(int(k.shape[0]) for k, _ in self._runs)

    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self._runs) + self._mem_entries * 12


class MemoryIndex(LocalIndex):
    """The default backend. Holds everything in this process, and what only verification
    reads in an unlinked temporary file in `records_dir` ("": records_home's choice; None:
    in RAM too); gone when it exits.

    URLs: a map url key -> rows (one more 8-byte entry a page; a hit is confirmed against
    `url_key(url)` of the row's stored URL, salted with its namespace), and a bit a row for
    the versions a newer one replaced and the pages forgotten. Their index keys and
    fingerprints are skipped by lookups and dropped at the next flush or merge that meets
    them; their row (~60 bytes and its URL) and record stay, unused. When rows were kept:
    a Timeline (local_forget.py)."""

    def __init__(self, stamp: int, max_posting: int = 64, records_dir: str | None = "",
                 url_key: Callable[[str], int] | None = None,
                 deep: DeepLayout = NO_DEEP_KEYS) -> None:
        """`deep`: where the deep containment keys are, held in deep.py's store (on disk
        beside the records; in RAM with them); by default none apart."""
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
        self._deep_layout = deep
        self._deep = DeepKeys(records_home(records_dir) if records_dir is not None else None,
                              deep.cap, dead) if deep.asked else None
        self._timeline = Timeline()
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

    def _dead_mask(self, rows: np.ndarray) -> np.ndarray | None:
        if not self._n_retired:
            return None
        bits = np.frombuffer(bytes(self._retired), np.uint8)
        gone = (bits[rows >> 3] >> (rows & 7) & 1).astype(bool)
        return gone if gone.any() else None

    def postings(self, features: np.ndarray) -> list[list[int]]:
        if self._deep is not None:
            asked = self._deep_layout.asked
            lists = self._features.postings(features[:-asked]) + \
                self._deep.postings(features[-asked:])
        else:
            lists = self._features.postings(features)
        if self._n_retired:  # the bit test inline: a call a row was 1.4 % of a recrawl's replay
            bits = self._retired
            return [[r for r in rows if not bits[r >> 3] >> (r & 7) & 1] for rows in lists]
        return lists

    def first_with(self, layer: int, fingerprint: int) -> int | None:
        """The first row with this RAW or CANONICAL fingerprint (32-bit keys: confirmed
        against the record's full fingerprint)."""
        for row in self._exact[layer].values(fingerprint):
            if self._docs.fingerprint_high(row, layer) == fingerprint >> 32 and not (
                    self._n_retired and self._gone(row)):
                return row
        return None

    def version_of(self, url_key: int) -> int | None:
        for row in reversed(self._urls.values(url_key)):
            if self._gone(row):
                continue
            namespace, url = unpack_url(self._docs.url_field(row))
            if self._url_key(url) ^ salt(namespace) == url_key:
                return row
        return None

    def retire(self, row: int) -> None:
        if not self._gone(row):
            self._retired[row >> 3] |= 1 << (row & 7)
            self._n_retired += 1
            self._timeline.remove(row, unpack_url(self._docs.url_field(row))[0])

    def forget(self, what: Forget) -> list[int]:
        """Retire every live row `what` selects (a URL: its version; page ids: a pass over
        the id column; else the rows of the Timeline's spans it may hold); their ids."""
        if what.page_ids:
            rows = self._docs.rows_of(sorted(what.page_ids))
        elif what.url is not None:
            key = what.salted_url_key or self._url_key(what.url) ^ salt(what.namespace or "")
            rows = [row] if (row := self.version_of(key)) is not None else []
        else:
            rows = [row for row, _ in selected_rows(
                self._timeline, len(self._docs), what, lambda r: not self._gone(r),
                self._docs.url_fields, lambda r: self._docs[r].fetched_at)]
        rows = [r for r in rows if not self._gone(r)]
        for row in rows:
            self.retire(row)
        return [self._docs.page_id(row) for row in rows]

    def namespaces(self) -> dict[str, dict[str, Any]]:
        return self._timeline.namespaces()

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

    def _extend(self, docs: list[StoredDoc], now: float | None = None) -> None:
        row = len(self._docs)
        self._docs.extend(docs)
        now = time.time() if now is None else now
        for at, doc in enumerate(docs, row):
            self._timeline.add(at, doc.namespace, doc.fetched_at, now)
        need = (len(self._docs) + 7) >> 3
        if len(self._retired) < need:
            self._retired.extend(bytes(need - len(self._retired) + 4096))
        stored = self._deep_layout.stored if self._deep is not None else 1 << 30
        for doc in docs:
            if doc.features.shape[0] > stored:
                self._features.add_many(doc.features[:stored], row)
                self._deep.add(doc.features[stored:], row)  # type: ignore[union-attr]
            else:
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
        if self._deep is not None:
            self._deep.close()

    @classmethod
    def warm_from(cls, lsm: LsmIndex, records_dir: str | None = "",
                  url_key: Callable[[str], int] | None = None,
                  deep: DeepLayout = NO_DEEP_KEYS) -> MemoryIndex:
        """A memory index holding every committed page of an LSM index (same rows)."""
        index = cls(lsm.stamp, lsm.max_posting, records_dir, url_key, deep)
        for row, doc, stored_at in lsm.stored_docs():
            if len(index._docs) < row:  # rows of forgotten or replaced pages stay unused
                gap = row - len(index._docs)
                index._extend([_GONE] * gap, stored_at)
                for unused in range(row - gap, row):
                    index.retire(unused)
            if not doc.url_key:
                doc.url_key = index._url_key(doc.url) ^ salt(doc.namespace)
            index._extend([doc], stored_at)
        index._offsets = lsm.offsets()
        index._next_local = lsm.local_ids(0).start
        return index

    def stats(self) -> dict[str, Any]:
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
            **({"deep_entries": len(self._deep), "deep_ram_bytes": deep["ram"],
                "deep_file_bytes": deep["on_disk"]}
               if self._deep is not None and (deep := self._deep.nbytes()) else {}),
            "namespaces": self.namespaces(),
        }
