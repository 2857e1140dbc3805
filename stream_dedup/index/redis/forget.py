"""The Redis index's lifecycle: forgetting held pages online, and what it holds per
namespace (for `index stats`). backend.py holds the protocol; this module reuses its retire
path, so a page forgotten leaves the index exactly as a version a newer one replaced does.

    scan     every record bucket ({n}P<bucket>: their names are known, SHARDS x
             record_buckets of them, so nothing is SCANned), a few hundred a script call
             per node in one pipelined round trip: each bucket's KEEP pages, with their
             verification records' heads, features, crawl times and URLs (not their
             sketches, signatures or shingle sets); from a records store, read with two
             GETRANGEs a record.
    select   namespaces.Forget.matches on each (its namespace and URL from the record's URL
             field, its crawl time, else the time in its id); --url: a point lookup of its
             URL key's set (the URL's kept version) instead, in one namespace.
    retire   in batches: each KEEP -> R (the decision stays, for a re-delivery), its
             verification record deleted, its ref out of every key it joined; the count of
             pages held down by those retired. A page no longer KEEP is skipped.

Instances may decide meanwhile: a page they keep while the scan runs may be missed (it was
kept after the forget began); a page being forgotten that another instance reads as KEEP is
a candidate until its record is gone, as with a replaced version.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np

from stream_dedup.errors import IndexMismatchError
from stream_dedup.index.base import StoredDoc
from stream_dedup.index.namespaces import Forget, page_time, unsalted_url_key
from stream_dedup.index.redis.client import memory
from stream_dedup.index.redis.layout import (
    BUCKET_ENDS,
    DOC_HEAD_BYTES,
    PAGES,
    SHARDS,
    STAMP,
    decode_light,
    doc_probe,
    skipped_bytes,
)
from stream_dedup.index.redis.reads import READ_SLACK, SetRounds

RECORDS_A_CALL = 2_000  # KEEP pages a scan's script call reads, about (it holds its node)
RETIRE_BATCH = 5_000  # pages retired a round trip
CUT_BUCKETS = 1_000  # set buckets a script call cuts forgotten pages out of


class Lifecycle(SetRounds):
    """forget, namespaces and stats (RedisIndex sets up the state)."""

    stamp: int
    _stamp_text: str  # what the Redis holds at STAMP for this index's settings

    def forget(self, what: Forget) -> list[int]:
        """Forget the KEEP pages `what` selects (FeatureIndex.forget), online. Refused
        (IndexMismatchError, nothing changed) if the Redis holds another index now."""
        self._same_index()
        if what.url is not None and what.url_key and what.namespace is not None:
            chosen = self._url_versions(what)
        else:
            chosen = [doc for batch in self._held() for doc in batch
                      if _selected(what, doc)]
        gone: dict[int, bytes] = {}  # page id -> ref
        for start in range(0, len(chosen), RETIRE_BATCH):
            batch = chosen[start : start + RETIRE_BATCH]
            gone.update(self._retire([(doc.page_id, None) for doc in batch], [],
                                     -len(batch), exact=True))
        self._cut([doc for doc in chosen if doc.page_id in gone and doc.raw_fp], gone)
        return list(gone)

    def _cut(self, docs: list[StoredDoc], refs: dict[int, bytes]) -> None:
        """The refs of pages retired out of every key they joined (as the retire path's
        leave, but a bucket at a time: a bucket holds entries of many pages forgotten)."""
        cuts: dict[bytes, list[bytes]] = {}
        shard_of: dict[bytes, int] = {}
        for doc in docs:
            ref = refs[doc.page_id]
            keys, shards = self.layout.probe_shards(doc_probe(doc))
            for key, shard in zip(keys, shards, strict=True):
                end = BUCKET_ENDS[shard]
                bucket = key[:end]
                entries = cuts.get(bucket)
                if entries is None:
                    entries = cuts[bucket] = []
                    shard_of[bucket] = shard
                entries.append(key[end:] + ref)
        nodes = self._shard_nodes()
        items = [(nodes[shard_of[b]], b, (b, len(entries), *entries), 0)
                 for b, entries in cuts.items()]
        per_node: dict[Any, list[Any]] = {}
        for item in items:
            per_node.setdefault(item[0], []).append(item)
        longest = max((len(v) for v in per_node.values()), default=0)
        for start in range(0, longest, CUT_BUCKETS):
            with self._call("claim"):
                self._rounds(("cut", [item for node_items in per_node.values()
                                      for item in node_items[start : start + CUT_BUCKETS]],
                              ()))

    def namespaces(self) -> dict[str, dict[str, Any]]:
        """Per namespace: KEEP pages and the crawl time of the oldest (a scan)."""
        count: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for batch in self._held():
            for doc in batch:
                ns = doc.namespace
                count[ns] = count.get(ns, 0) + 1
                when = page_time(doc.fetched_at, _stored_at(doc.page_id))
                if when is not None and when < oldest.get(ns, float("inf")):
                    oldest[ns] = when
        return {ns: {"pages": n, "oldest": datetime.fromtimestamp(oldest[ns], UTC).isoformat()
                     if ns in oldest else None} for ns, n in sorted(count.items())}

    def stats(self) -> dict[str, Any]:
        """Pages kept (the count), Redis memory summed over every primary (and over the
        records store's, if it has one) and per page. Not namespaces(): a scan of the
        whole index, which the metrics' stats after a batch must not wait for (`index
        stats` asks for both)."""
        with self._call("stats"):
            keys, used = memory(self.client)
            pages = int(self.client.get(PAGES) or 0)
            out: dict[str, Any] = {"pages": pages, "keys": keys, "index_bytes": used,
                                   "index_bytes_per_page": used / pages if pages else 0.0,
                                   "redis_used_memory": used}
            if self.records is not None:
                out["records_keys"], out["records_bytes"] = memory(self.records)
                out["records_used_memory"] = out["records_bytes"]
        return out

    # --- the scan -----------------------------------------------------------------------
    def _held(self) -> Iterator[list[StoredDoc]]:
        """Every KEEP page's light record (redis_layout.decode_light), a round trip's worth
        at a time (a page whose record is gone: a record with its id only)."""
        nodes = self._shard_nodes()
        by_node: dict[Any, list[bytes]] = {}
        buckets = self.layout.record_buckets
        for shard in range(SHARDS):
            for b in range(buckets):
                by_node.setdefault(nodes[shard], []).append(self.layout.record_bucket(shard, b))
        with self._call("count"):
            pages = int(self.client.get(PAGES) or 0)
        per_call = max(16, min(2_000, RECORDS_A_CALL * SHARDS * buckets // max(pages, 1)))
        here = b"" if self.records is not None else b"1"
        for start in range(0, max(map(len, by_node.values())), per_call):
            items = [(node, key, (key,), 1) for node, keys in by_node.items()
                     for key in keys[start : start + per_call]]
            with self._call("scan"):
                found = self._rounds(("held", items, (here,)))[0]
            ids, raws = [], []
            for kept in found:
                for i in range(0, len(kept), 2 if here else 1):
                    ids.append(int.from_bytes(kept[i], "big"))
                    raws.append(kept[i + 1] if here else None)
            if not here and ids:
                raws = self._light_records(ids)
            yield [decode_light(raw, q) if raw else _bare(q) for q, raw in zip(ids, raws,
                                                                                strict=True)]

    def _light_records(self, ids: list[int]) -> list[bytes | None]:
        """From the records store (plain commands): each record's head, then the rest from
        its features on (two GETRANGEs: none of its sketch, signature or shingle set)."""
        keys = [self.layout.doc_key(q) for q in ids]
        heads = self._on_records(lambda pipe: [pipe.getrange(k, 0, DOC_HEAD_BYTES - 1)
                                               for k in keys])
        there = [(k, h) for k, h in zip(keys, heads, strict=True)
                 if h and len(h) == DOC_HEAD_BYTES]
        tails = iter(self._on_records(lambda pipe: [
            pipe.getrange(k, DOC_HEAD_BYTES + skipped_bytes(h), -1) for k, h in there]))
        return [h + next(tails) if h and len(h) == DOC_HEAD_BYTES else None for h in heads]

    def _url_versions(self, what: Forget) -> list[StoredDoc]:
        """The KEEP pages in the set of `what`'s (salted) URL key: its version (two while a
        replaced one is being retired), read as a join reads a URL's set."""
        key = self.layout.set_key(b"u", what.salted_url_key)
        node = self._shard_nodes()[what.salted_url_key % SHARDS]
        with self._call("read"):
            refs = self._rounds(("read", [(node, key, (key,), 1)],
                                 (self.cap + READ_SLACK, READ_SLACK)))[0][0]
        seen = {int.from_bytes(r, "big"): 0 for r in refs}
        states, ids = self._peek(seen, flag=False, fresh=seen)
        kept = [ids[r] for r, state in states.items() if state == "K" and r in ids]
        docs = self._docs(kept)
        return [docs.get(q) or _bare(q) for q in kept if q not in docs
                or _selected(what, docs[q])]

    def _same_index(self) -> None:
        """The Redis still holds this index (its stamp: sketch parameters, layout), or
        nothing at all (then there is nothing to forget)."""
        with self._call("stamp"):
            stored = self.client.get(STAMP)
        if stored is not None and stored.decode("utf-8", "replace") != self._stamp_text:
            raise IndexMismatchError(
                f"the Redis at {self.url} holds an index stamped {stored[:60]!r} now, not "
                f"{self._stamp_text!r} (these settings): nothing forgotten. Use the "
                "settings its instances run with.")


def _selected(what: Forget, doc: StoredDoc) -> bool:
    """Whether `what` selects a held page (a URL by its key, when it has one: as the
    deduplicator computes URL keys; a page without a record by id, or by --all of every
    namespace)."""
    if not doc.url and not doc.raw_fp:  # its record is gone: nothing to match on
        return doc.page_id in what.page_ids or (what.all and what.namespace is None)
    if what.url is not None and what.url_key and not what.page_ids:
        return ((what.namespace is None or doc.namespace == what.namespace)
                and unsalted_url_key(doc) == what.url_key)
    return what.matches(doc.namespace, doc.url, page_time(doc.fetched_at,
                                                          _stored_at(doc.page_id)), doc.page_id)


def _stored_at(page_id: int) -> float | None:
    """The time in a page id (its Kafka timestamp; a replay's start), None if 0."""
    ms = page_id >> 56
    return ms / 1000 if ms else None


def _bare(page_id: int) -> StoredDoc:
    """A KEEP page whose verification record is gone (retention, meanwhile)."""
    return StoredDoc("", np.zeros(0, np.uint64), np.zeros(0, np.uint32), b"", 0, 0, 0,
                     page_id=page_id)
