"""The LSM index's lifecycle: what it keeps to forget pages fast, and forgetting them.

Three things beside the pages themselves (lsm.py's docs, features, exact, urls):

    ids       page id (16 bytes) -> row (u32) + its URL key (u64, salted; 0: none): a
              changelog's tombstone names a page id, and a record holds no URL key
    times     salt of its namespace (u64) + page time in ms (u64) + row (u32) -> b"": per
              namespace in time order (crawl time, else stored; namespaces.page_time), so
              `before` and a namespace's oldest page are a range read, not a scan
    meta      b"ns:" + namespace -> its pages (u64); b"lifecycle" -> 1 once the above cover
              every page (an index written before them gets them in one pass when opened)

A page is forgotten by deleting its keys from all of them and the counters, in one
WriteBatch; what selects it: a URL is a point lookup (the URL map), page ids are (ids), a
time is a range of `times`, a namespace's every page is its range of `times`, and a host
is a pass over the records reading only their heads and URLs (doc_codec.peek).
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rocksdict import ColumnFamily, Rdict, WriteBatch

from stream_dedup.index.base import CANONICAL, RAW, StoredDoc
from stream_dedup.index.doc_codec import Peek, peek, url_field
from stream_dedup.index.local_forget import iso
from stream_dedup.index.namespaces import Forget, host_of, page_time, salt, unpack_url

log = logging.getLogger("stream_dedup.index")

CF_IDS, CF_TIMES = "ids", "times"
LIFECYCLE = b"lifecycle"
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_FEATURE_KEY = struct.Struct(">QI")
_ID = struct.Struct(">IQ")  # row, url key
_TIME = struct.Struct(">QQI")  # namespace salt, time (ms), row
_LAYER = {RAW: b"r", CANONICAL: b"c"}
_ID_BYTES = 16


def time_key(namespace: str, when: float, row: int) -> bytes:
    return _TIME.pack(salt(namespace), max(0, int(when * 1000)), row)


def id_key(page_id: int) -> bytes:
    return page_id.to_bytes(_ID_BYTES, "big")


class PageLifecycle:
    """The lifecycle half of LsmIndex (lsm.py), which inherits it: the keys above, kept in
    step with the pages, and selecting and deleting committed pages. What it uses of the
    index is declared here; LsmIndex sets it (its column families, counters and overlay)."""

    path: Path
    _meta: Rdict
    _exact: Rdict
    _docs: Rdict
    _urls: Rdict
    _ids: Rdict
    _times: Rdict
    _cf: dict[str, ColumnFamily]
    _ns: dict[str, int]  # pages per namespace, committed
    _new_docs: dict[int, StoredDoc]  # the uncommitted overlay's pages, by row
    _retired: set[int]  # rows replaced or forgotten since the last commit

    if TYPE_CHECKING:
        def version_of(self, url_key: int) -> int | None: ...

        def _write(self, batch: WriteBatch) -> None: ...

    def _counts(self) -> dict[str, int]:
        """Pages per namespace, as the last commit or forget wrote them."""
        out = {}
        for key, value in self._meta.items(from_key=b"ns:"):
            if not key.startswith(b"ns:"):
                break
            out[key[3:].decode()] = _U64.unpack(value)[0]
        return out

    def _put_counts(self, batch: WriteBatch, delta: dict[str, int]) -> None:
        """Apply `delta` to the index's counters, in `batch` and in self._ns."""
        for name, d in delta.items():
            if not d:
                continue
            n = self._ns.get(name, 0) + d
            if n > 0:
                self._ns[name] = n
                batch.put(b"ns:" + name.encode(), _U64.pack(n), self._cf["meta"])
            else:
                self._ns.pop(name, None)
                batch.delete(b"ns:" + name.encode(), self._cf["meta"])

    def _put_page(self, batch: WriteBatch, row: int, doc: StoredDoc, now: float,
                  delta: dict[str, int]) -> None:
        """The lifecycle keys of a page committed now."""
        batch.put(id_key(doc.page_id), _ID.pack(row, doc.url_key), self._cf[CF_IDS])
        when = page_time(doc.fetched_at, now)
        batch.put(time_key(doc.namespace, when if when is not None else now, row), b"",
                  self._cf[CF_TIMES])
        delta[doc.namespace] = delta.get(doc.namespace, 0) + 1

    def _delete_pages(self, batch: WriteBatch, pages: list[tuple[int, Peek]],
                      delta: dict[str, int]) -> None:
        """Delete committed pages (row, record head) from every structure, in `batch`: their
        record, keys, the fingerprints, URL and id entries that still name them, their time and
        their namespace's count (what names them read in three multi-gets, not a get a key)."""
        if not pages:
            return
        cf = self._cf
        exact_keys = [_LAYER[layer] + _U64.pack(fp) for _, head in pages
                      for layer, fp in ((RAW, head.raw_fp), (CANONICAL, head.canonical_fp))]
        exact = self._exact.get(exact_keys)
        ids = self._ids.get([id_key(head.page_id) for _, head in pages])
        url_keys = [_U64.pack(_ID.unpack(got)[1]) if got is not None and got[:4] == _U32.pack(row)
                    else None for (row, _), got in zip(pages, ids, strict=True)]
        urls = self._urls.get([k for k in url_keys if k is not None])
        urls.reverse()
        for i, (row, head) in enumerate(pages):
            row_bytes = _U32.pack(row)
            batch.delete(row_bytes, cf["docs"])
            for feature in head.features:
                batch.delete(_FEATURE_KEY.pack(feature, row), cf["features"])
            for key, holder in zip(exact_keys[2 * i : 2 * i + 2], exact[2 * i : 2 * i + 2],
                                   strict=True):
                if holder == row_bytes:
                    batch.delete(key, cf["exact"])
            if url_keys[i] is not None:
                batch.delete(id_key(head.page_id), cf[CF_IDS])
                if urls.pop() == row_bytes and url_keys[i] != _U64.pack(0):
                    batch.delete(url_keys[i], cf["urls"])
            namespace = unpack_url(head.url_field)[0]
            when = page_time(head.fetched_at, head.stored_at)
            batch.delete(time_key(namespace, when if when is not None else head.stored_at, row),
                         cf[CF_TIMES])
            delta[namespace] = delta.get(namespace, 0) - 1

    def _head_of(self, row: int) -> Peek | None:
        raw = self._docs.get(_U32.pack(row))
        return None if raw is None else peek(raw, row)

    # --- which committed pages a Forget selects -----------------------------------------------

    def _selected(self, what: Forget) -> Iterator[tuple[int, Peek]]:
        """(row, record head) of every committed page `what` selects, but those the overlay
        retired (they go at the next commit)."""
        gone = self._retired
        if what.page_ids:
            for page_id in sorted(what.page_ids):
                got = self._ids.get(id_key(page_id))
                row = None if got is None else _ID.unpack(got)[0]
                if row is not None and row not in gone and (head := self._head_of(row)):
                    if head.page_id == page_id:
                        yield row, head
        elif what.url is not None:
            row = self.version_of(what.salted_url_key)
            if row is not None and row not in self._new_docs and (head := self._head_of(row)):
                yield row, head
        elif what.host is None:  # a time, or every page: ranges of `times`
            names = list(self._ns) if what.namespace is None else [what.namespace]
            for name in names:
                for row in self._time_range(name, what.before):
                    if row not in gone and (head := self._head_of(row)):
                        yield row, head
        else:
            host = what.host.encode()
            for key, raw in self._docs.items():
                field = url_field(raw)
                if host not in field.lower():  # most pages: no host_of (~5 µs) for them
                    continue
                namespace, url = unpack_url(field)
                if what.namespace is not None and namespace != what.namespace:
                    continue
                row = _U32.unpack(key)[0]
                if host_of(url) == what.host and row not in gone:
                    yield row, peek(raw, row)

    def _forget_all(self, batch: WriteBatch, forgotten: list[int]) -> int:
        """Every committed page: ranges deleted, not keys; the ids read for the journal (but
        those of versions the overlay replaced: they were gone already). The pages deleted."""
        replaced = {_U32.pack(row) for row in self._retired - self._new_docs.keys()}
        removed = 0
        for key, value in self._ids.items():
            removed += 1
            if value[:4] not in replaced:
                forgotten.append(int.from_bytes(key, "big"))
        self._retired &= self._new_docs.keys()
        for name in ("docs", "features", "exact", "urls", CF_IDS, CF_TIMES):
            batch.delete_range(b"", b"\xff" * 32, self._cf[name])
        self._put_counts(batch, {name: -n for name, n in self._ns.items()})
        return removed

    def _time_range(self, namespace: str, before: float | None) -> list[int]:
        """Rows of `namespace` with a page time before `before` (None: all), oldest first."""
        prefix = _U64.pack(salt(namespace))
        end = prefix + (_U64.pack(max(0, int(before * 1000))) if before is not None
                        else b"\xff" * 12)
        rows = []
        for key in self._times.keys(from_key=prefix):
            if key >= end or key[:8] != prefix:
                break
            rows.append(_TIME.unpack(key)[2])
        return rows

    def _oldest(self, namespace: str) -> float | None:
        """The earliest page time of a namespace's committed pages."""
        prefix = _U64.pack(salt(namespace))
        for key in self._times.keys(from_key=prefix):
            return _TIME.unpack(key)[1] / 1000 if key[:8] == prefix else None
        return None

    # --- an index written before the lifecycle keys -------------------------------------------

    def _upgrade(self) -> None:
        """Write ids, times and the counters of every committed page (once, when an index
        written before them is opened; idempotent if interrupted)."""
        if self._meta.get(LIFECYCLE) is not None:
            return
        started = time.monotonic()
        url_keys = {_U32.unpack(row)[0]: _U64.unpack(key)[0]
                    for key, row in self._urls.items()}
        delta: dict[str, int] = {}
        batch, n = WriteBatch(raw_mode=True), 0
        for key, raw in self._docs.items():
            row = _U32.unpack(key)[0]
            head = peek(raw, row)
            namespace = unpack_url(head.url_field)[0]
            batch.put(id_key(head.page_id), _ID.pack(row, url_keys.get(row, 0)),
                      self._cf[CF_IDS])
            when = page_time(head.fetched_at, head.stored_at)
            batch.put(time_key(namespace, when if when is not None else head.stored_at, row),
                      b"", self._cf[CF_TIMES])
            delta[namespace] = delta.get(namespace, 0) + 1
            n += 1
            if n % 50_000 == 0:
                self._write(batch)
                batch = WriteBatch(raw_mode=True)
        self._ns = {}
        for name in self._counts():
            batch.delete(b"ns:" + name.encode(), self._cf["meta"])
        self._put_counts(batch, delta)
        batch.put(LIFECYCLE, _U32.pack(1), self._cf["meta"])
        self._write(batch)
        if n:
            log.info("index at %s: page ids and times written for %d pages (once) in %.1f s",
                     self.path, n, time.monotonic() - started)

    def _overlay_namespaces(self) -> dict[str, Any]:
        """Pages per namespace with the uncommitted overlay, and each one's oldest page."""
        pages = dict(self._ns)
        earliest: dict[str, float] = {}
        now = time.time()
        for row, doc in self._new_docs.items():
            if row in self._retired:
                continue
            pages[doc.namespace] = pages.get(doc.namespace, 0) + 1
            when = page_time(doc.fetched_at, now) or now
            earliest[doc.namespace] = min(earliest.get(doc.namespace, when), when)
        for row in self._retired - self._new_docs.keys():
            if head := self._head_of(row):
                name = unpack_url(head.url_field)[0]
                pages[name] = pages.get(name, 0) - 1
        out = {}
        for name in sorted(pages):
            if pages[name] <= 0:
                continue
            times = [t for t in (self._oldest(name), earliest.get(name)) if t is not None]
            out[name] = {"pages": pages[name], "oldest": iso(min(times) if times else None)}
        return out
