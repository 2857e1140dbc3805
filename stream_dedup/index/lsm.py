"""Persistent index: RocksDB (through rocksdict) in one directory, restarts invisible.

Column families and keys (integers big-endian, so keys sort numerically):

    meta      b"stamp" -> sketch Params stamp (u64)     b"next_id" -> next row (u32)
              b"pages" -> pages held (u64)              b"off:" + source -> next offset (u64)
              b"next_local" -> next local page id (u64, see FeatureIndex.local_ids)
              b"inflight" -> the plan of the batch being decided (JSON), deleted by commit
    features  feature (u64) + row (u32)  -> b""     (a posting list is a prefix scan)
    exact     b"r"|b"c" + fingerprint (u64)  -> row (u32), the page holding it
    docs      row (u32) -> the document record verification reads (see _encode)
    urls      url key (u64, core/urls.py, salted) -> row (u32): the URL's one kept
              version; a new version deletes the old one's record, features, fingerprints
              in the commit that writes it
    ids, times, meta b"ns:"...: a page's id, its time, pages per namespace: what
              forgetting reads (lsm_pages.py)

Rows number the kept pages in insertion order (they are this backend's handles); a page's
public id is in its record (format 1 records have none: their id is their row).

Nothing reaches RocksDB until `commit()`: inserts wait in an in-memory overlay that lookups
also read, and `commit(offsets)` writes the overlay *and* the consumed input offsets in one
atomic WriteBatch. After a crash the index therefore holds exactly the pages before the
offsets it stores, and the service resumes from those offsets: no page missing, none that
will be seen again.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import struct
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from rocksdict import (
    BlockBasedOptions,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    SliceTransform,
    WriteBatch,
)

from stream_dedup.core.urls import UrlKeys
from stream_dedup.errors import IndexMismatchError, IndexStoreError
from stream_dedup.index.base import CANONICAL, RAW, Docs, LocalIndex, Plan, StoredDoc
from stream_dedup.index.doc_codec import decode_doc, encode_doc
from stream_dedup.index.lsm_pages import CF_IDS, CF_TIMES, PageLifecycle
from stream_dedup.index.namespaces import Forget, page_time

log = logging.getLogger("stream_dedup.index")

CF_META, CF_FEATURES, CF_EXACT, CF_DOCS, CF_URLS = "meta", "features", "exact", "docs", "urls"
FORMAT = 1
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_FEATURE_KEY = struct.Struct(">QI")
_LAYER = {RAW: b"r", CANONICAL: b"c"}
_MAX_ID = b"\xff\xff\xff\xff"
_INFLIGHT = b"inflight"


def _options(prefix: int | None) -> Options:
    opt = Options(raw_mode=True)
    opt.create_if_missing(True)
    opt.set_compression_type(DBCompressionType.zstd())
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    if prefix is not None:
        opt.set_prefix_extractor(SliceTransform.create_fixed_prefix(prefix))
    opt.set_block_based_table_factory(table)
    return opt


class LsmIndex(LocalIndex, PageLifecycle):
    """A FeatureIndex kept on disk. One process at a time (RocksDB holds a lock)."""

    def __init__(self, path: str | Path, stamp: int | None, max_posting: int = 64,
                 *, create: bool = True) -> None:
        """`stamp` None adopts the stored one (operator commands that only inspect)."""
        self.path = Path(path)
        self.stamp = 0 if stamp is None else stamp
        self.max_posting = self.cap = max_posting
        self._closed = False
        self._check_directory(create)
        families = {CF_META: _options(None), CF_FEATURES: _options(8),
                    CF_EXACT: _options(None), CF_DOCS: _options(None), CF_URLS: _options(None),
                    CF_IDS: _options(None), CF_TIMES: _options(None)}
        db_options = _options(None)
        db_options.create_missing_column_families(True)
        try:
            self._db = Rdict(str(self.path), db_options, column_families=families)
        except Exception as exc:  # rocksdict raises plain Exception for every failure
            raise IndexStoreError(f"cannot open the index at {self.path}: {exc}") from None
        self._meta = self._db.get_column_family(CF_META)
        self._features = self._db.get_column_family(CF_FEATURES)
        self._exact = self._db.get_column_family(CF_EXACT)
        self._docs = self._db.get_column_family(CF_DOCS)
        self._urls = self._db.get_column_family(CF_URLS)
        self._ids = self._db.get_column_family(CF_IDS)
        self._times = self._db.get_column_family(CF_TIMES)
        self._cf = {name: self._db.get_column_family_handle(name) for name in families}
        self._read = ReadOptions()
        self._read.set_prefix_same_as_start(True)
        self._adopt_or_check_stamp(adopt=stamp is None)
        self._next_id = self._meta_int(b"next_id")
        self._next_local = self._meta_int(b"next_local")
        self._pages = self._meta_int(b"pages")
        self._ns = self._counts()
        self._reset_overlay()
        self._upgrade()

    # --- opening ------------------------------------------------------------------------
    def _check_directory(self, create: bool) -> None:
        if self.path.exists() and not self.path.is_dir():
            raise IndexStoreError(f"index path {self.path} exists and is not a directory")
        if not self.path.exists():
            if not create:
                raise IndexStoreError(f"no index at {self.path}")
            return
        entries = set(os.listdir(self.path))
        if entries and "CURRENT" not in entries:
            raise IndexStoreError(
                f"{self.path} is not empty and holds no index (no CURRENT file); "
                "refusing to write into it")

    def _adopt_or_check_stamp(self, adopt: bool) -> None:
        raw = self._meta.get(b"stamp")
        if raw is not None and adopt:
            self.stamp = _U64.unpack(raw)[0]
            return
        if raw is None:
            if self._meta.get(b"next_id") is not None or any(True for _ in self._docs.keys()):
                raise IndexStoreError(f"index at {self.path} has pages but no parameter stamp")
            batch = WriteBatch(raw_mode=True)
            batch.put(b"stamp", _U64.pack(self.stamp), self._cf[CF_META])
            batch.put(b"format", _U32.pack(FORMAT), self._cf[CF_META])
            self._write(batch)
            return
        stored = _U64.unpack(raw)[0]
        if stored != self.stamp:
            raise IndexMismatchError(
                f"the index at {self.path} was built with other sketch parameters "
                f"(stamp {stored:#x}, these settings give {self.stamp:#x}); features would "
                "not be comparable. Use the same settings, or another --index-path.")

    def _meta_int(self, key: bytes) -> int:
        raw = self._meta.get(key)
        return 0 if raw is None else int.from_bytes(raw, "big")

    def _reset_overlay(self) -> None:
        self._new_docs: dict[int, StoredDoc] = {}
        self._new_features: dict[int, list[int]] = {}
        self._new_urls: dict[int, int] = {}
        self._retired: set[int] = set()  # rows replaced since the last commit
        self._new_exact: dict[bytes, int] = {}

    # --- FeatureIndex -------------------------------------------------------------------
    def __len__(self) -> int:
        return self._pages + len(self._new_docs) - len(self._retired)

    def records(self) -> Docs:
        return self

    def __getitem__(self, row: int) -> StoredDoc:
        return self.doc(row)

    def first_with(self, layer: int, fingerprint: int) -> int | None:
        key = _LAYER[layer] + _U64.pack(fingerprint)
        pending = self._new_exact.get(key)
        if pending is not None and pending not in self._retired:
            return pending
        raw = self._exact.get(key)
        row = None if raw is None else _U32.unpack(raw)[0]
        return None if row in self._retired else row

    def version_of(self, url_key: int) -> int | None:
        row = self._new_urls.get(url_key)
        if row is None:
            raw = self._urls.get(_U64.pack(url_key))
            row = None if raw is None else _U32.unpack(raw)[0]
            if row is not None and self._docs.get(_U32.pack(row)) is None:
                return None  # expired (retention)
        return None if row in self._retired else row

    def retire(self, row: int) -> None:
        self._retired.add(row)

    def postings(self, features: np.ndarray) -> list[list[int]]:
        """Each feature's `cap` most recent rows: committed ones, then the overlay's."""
        out: list[list[int]] = []
        it = self._features.iter(self._read)
        try:
            for feature in features.tolist():
                prefix = _U64.pack(feature)
                it.seek_for_prev(prefix + _MAX_ID)
                rows: list[int] = []
                while it.valid() and len(rows) < self.cap:
                    key = it.key()
                    if key[:8] != prefix:
                        break
                    rows.append(_U32.unpack_from(key, 8)[0])
                    it.prev()
                rows.reverse()
                rows += self._new_features.get(feature, [])
                if self._retired:
                    rows = [r for r in rows if r not in self._retired]
                out.append(rows[-self.cap:])
        finally:
            del it
        return out

    def insert(self, doc: StoredDoc) -> int:
        """Store a kept page (at the next commit); its row."""
        page_id = self._next_id
        self._next_id += 1
        self._new_docs[page_id] = doc
        for feature in doc.features.tolist():
            self._new_features.setdefault(feature, []).append(page_id)
        keys = [_LAYER[RAW] + _U64.pack(doc.raw_fp)]
        if doc.text_length > 0:
            keys.append(_LAYER[CANONICAL] + _U64.pack(doc.canonical_fp))
        for key in keys:  # the first page, unless a newer version of its URL replaced it
            if self._new_exact.get(key) in self._retired or key not in self._new_exact:
                self._new_exact[key] = page_id
        if doc.url_key:
            self._new_urls[doc.url_key] = page_id
        return page_id

    def doc(self, page_id: int) -> StoredDoc:
        pending = self._new_docs.get(page_id)
        if pending is not None:
            return pending
        raw = self._docs.get(_U32.pack(page_id))
        if raw is None:
            raise KeyError(page_id)
        return decode_doc(raw, page_id)[0]

    # --- durability ---------------------------------------------------------------------
    def commit(self, offsets: Mapping[str, int] | None = None) -> None:
        """Write what was inserted since the last commit, with the input offsets it covers,
        in one atomic batch."""
        if not self._new_docs and not offsets and self._next_local == self._meta_int(
                b"next_local"):
            return
        batch = WriteBatch(raw_mode=True)
        now = time.time()
        gone = self._retired
        delta: dict[str, int] = {}
        self._delete_pages(batch, [  # first: a put below wins
            (row, head) for row in sorted(gone - self._new_docs.keys())
            if (head := self._head_of(row))], delta)
        for page_id, doc in self._new_docs.items():
            if page_id not in gone:
                batch.put(_U32.pack(page_id), encode_doc(doc, now), self._cf[CF_DOCS])
                self._put_page(batch, page_id, doc, now, delta)
        for feature, ids in self._new_features.items():
            for page_id in ids:
                if page_id not in gone:
                    batch.put(_FEATURE_KEY.pack(feature, page_id), b"", self._cf[CF_FEATURES])
        for key, page_id in self._new_exact.items():
            if page_id not in gone:
                batch.put(key, _U32.pack(page_id), self._cf[CF_EXACT])
        for url_key, page_id in self._new_urls.items():
            if page_id not in gone:
                batch.put(_U64.pack(url_key), _U32.pack(page_id), self._cf[CF_URLS])
        for source, offset in (offsets or {}).items():
            batch.put(b"off:" + source.encode(), _U64.pack(offset), self._cf[CF_META])
        batch.delete(_INFLIGHT, self._cf[CF_META])
        pages = len(self)
        batch.put(b"next_id", _U32.pack(self._next_id), self._cf[CF_META])
        batch.put(b"next_local", _U64.pack(self._next_local), self._cf[CF_META])
        batch.put(b"pages", _U64.pack(pages), self._cf[CF_META])
        self._put_counts(batch, delta)
        self._write(batch)
        self._pages = pages
        self._reset_overlay()

    def offsets(self) -> dict[str, int]:
        """Input offsets stored by the last commit: source (e.g. "topic/partition") -> next."""
        out: dict[str, int] = {}
        for key, value in self._meta.items(from_key=b"off:"):
            if not key.startswith(b"off:"):
                break
            out[key[4:].decode()] = _U64.unpack(value)[0]
        return out

    def begin(self, plan: Plan) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(_INFLIGHT, json.dumps(plan).encode(), self._cf[CF_META])
        self._write(batch)

    def inflight(self) -> Plan | None:
        raw = self._meta.get(_INFLIGHT)
        if raw is None:
            return None
        return [(str(s), int(f), int(e)) for s, f, e in json.loads(raw)]

    def _write(self, batch: WriteBatch) -> None:
        try:
            self._db.write(batch)
        except Exception as exc:
            raise IndexStoreError(f"writing the index at {self.path} failed: {exc}") from None

    # --- operations ---------------------------------------------------------------------
    def forget(self, what: Forget) -> list[int]:
        """Forget what `what` selects: committed pages in one WriteBatch of their keys (the
        URL map, ids, times and the counters with them), uncommitted ones retired from the
        overlay (never written). Safe between batches; offline too (`index forget`)."""
        if what.url is not None and not what.url_key:
            what = replace(what, url_key=UrlKeys().key(what.url))
        forgotten: list[int] = []
        now = time.time()
        version = self.version_of(what.salted_url_key) if what.url is not None else None
        for row, doc in self._new_docs.items():
            if row in self._retired:
                continue
            if row == version if what.url is not None else what.matches(
                    doc.namespace, doc.url, page_time(doc.fetched_at, now), doc.page_id):
                self._retired.add(row)
                forgotten.append(doc.page_id)
        batch = WriteBatch(raw_mode=True)
        delta: dict[str, int] = {}
        removed = 0
        if what.all and what.namespace is None and not what.page_ids:
            removed = self._forget_all(batch, forgotten)
        else:
            pages = list(self._selected(what))
            self._delete_pages(batch, pages, delta)
            forgotten += [head.page_id for _, head in pages]
            removed = len(pages)
        if removed:
            self._pages -= removed
            batch.put(b"pages", _U64.pack(self._pages), self._cf[CF_META])
            self._put_counts(batch, delta)
            self._write(batch)
        return forgotten

    def namespaces(self) -> dict[str, dict[str, Any]]:
        return self._overlay_namespaces()

    def compact(self) -> None:
        self._db.flush()
        for name in (CF_FEATURES, CF_EXACT, CF_DOCS, CF_URLS, CF_IDS, CF_TIMES, CF_META):
            self._db.get_column_family(name).compact_range(None, None)

    def export(self, target: str | Path) -> None:
        """A consistent copy of the committed index (a RocksDB checkpoint) in `target`."""
        from rocksdict import Checkpoint

        if Path(target).exists():
            raise IndexStoreError(f"export target {target} exists; refusing to overwrite it")
        Checkpoint(self._db).create_checkpoint(str(target))

    def stored_docs(self) -> Any:
        """(row, StoredDoc, stored at) of every committed page, in row order (warming a
        MemoryIndex)."""
        for key, raw in self._docs.items():
            row = _U32.unpack(key)[0]
            yield (row, *decode_doc(raw, row))

    def stats(self) -> dict[str, Any]:
        families = {CF_META: self._meta, CF_FEATURES: self._features, CF_EXACT: self._exact,
                    CF_DOCS: self._docs, CF_URLS: self._urls, CF_IDS: self._ids,
                    CF_TIMES: self._times}

        def prop(cf: str, name: str) -> int:
            return int(families[cf].property_int_value(name) or 0)

        feature_bytes = prop(CF_FEATURES, "rocksdb.total-sst-files-size") + prop(
            CF_FEATURES, "rocksdb.size-all-mem-tables")
        total = sum(prop(cf, "rocksdb.total-sst-files-size")
                    + prop(cf, "rocksdb.size-all-mem-tables") for cf in self._cf)
        pages = len(self)
        return {
            "pages": pages,
            "feature_entries": prop(CF_FEATURES, "rocksdb.estimate-num-keys"),
            "index_bytes": feature_bytes,
            "index_bytes_per_page": feature_bytes / pages if pages else 0.0,
            "disk_bytes": total,
            "disk_bytes_per_page": total / pages if pages else 0.0,
            "namespaces": self.namespaces(),
        }

    def close(self) -> None:
        """Release the directory (RocksDB's lock goes only when no handle is left)."""
        if self._closed:
            return
        self._closed = True
        db = self._db
        for name in ("_meta", "_features", "_exact", "_docs", "_urls", "_ids", "_times", "_cf",
                     "_read", "_db"):
            delattr(self, name)
        try:
            db.close()
        except Exception as exc:  # e.g. the disk filled up: what was committed stays
            log.warning("closing the index at %s: %s", self.path, exc)
        del db
        gc.collect()

