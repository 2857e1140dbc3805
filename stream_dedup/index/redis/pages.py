"""The Redis index's write path and its records: when a page's entries expire, its
record's claim (KEEP or DROP, the verification record with a keep), a dropped page or a
replaced version leaving its sets, and the records read back (docs). The caches of what
this instance knows of other pages (final states, refs, records) live here too.
backend.py holds the protocol; reads.py the read path.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stream_dedup.errors import IndexUnavailable
from stream_dedup.index.base import Claim, Probe, StoredDoc
from stream_dedup.index.redis.client import ScriptClient, shard_of
from stream_dedup.index.redis.layout import (
    SHARDS,
    Layout,
    decode_doc,
    doc_probe,
    encode_decision,
    encode_doc,
)
from stream_dedup.index.redis.lease import Leases

CACHED_STATES, CACHED_RECORDS = 1_000_000, 20_000  # final states and kept records cached
CACHED_REFS = 200_000  # refs known (of the pages decided here and of those seen)
# Pages whose records went to the records store before their keep held, at most: one
# left out is one whose keep another instance's copy won (the record is theirs too)
# or whose record, if the page is dropped later, waits for retention instead.
UNKEPT_HELD = 100_000


class RecordRounds(ScriptClient):
    """Rounds on the pages' records (RedisIndex sets up the state)."""

    layout: Layout
    leases: Leases  # the pages this instance is deciding, their leases renewed
    retention_s: int
    _unkept: OrderedDict[int, None]  # written to the records store, not kept yet
    _final: OrderedDict[int, tuple[str, int]]  # by ref: final state, page id
    _refs: OrderedDict[int, bytes]  # page id -> ref
    _records: OrderedDict[int, StoredDoc]

    def join_probe(self, p: Probe) -> Probe:
        """A page's probe as far as it joins keys (RedisIndex's: without the keys it only
        asks with). A probe made from a stored record has only those already."""
        raise NotImplementedError

    def expire_at(self, page_id: int) -> int:
        """When a page's keys may go (epoch s): `retention_days` after its crawl time, the
        time in its id (a Kafka record's timestamp; a replay's start), and not within the
        hour (or the window, if shorter): an old page is still held while it and its races
        are being decided. 0: no retention."""
        if not self.retention_s:
            return 0
        now = int(time.time())
        return max((page_id >> 56) // 1000 + self.retention_s, now + min(3600, self.retention_s))

    def _know(self, page_id: int, ref: bytes) -> None:
        remember(self._refs, page_id, ref, CACHED_REFS)

    def _finally(self, page_id: int, state: str, ref: bytes | None = None) -> None:
        """Remember a page's final state (if its ref is known)."""
        ref = ref or self._refs.get(page_id)
        if ref is not None:
            remember(self._final, int.from_bytes(ref, "big"), (state, page_id),
                      CACHED_STATES)

    def _docs(self, handles: list[int]) -> dict[int, StoredDoc]:
        docs = {h: self._records[h] for h in handles if h in self._records}
        ask = [h for h in handles if h not in docs]
        if not ask:
            return docs
        if self.records is not None:
            replies = self._on_records(lambda pipe: [pipe.get(self.layout.doc_key(h))
                                                     for h in ask])
        else:
            nodes = self._shard_nodes()
            items = []
            for h in ask:
                key = self.layout.record_key(h)
                items.append((nodes[h % SHARDS], key, (key,), 1))
            with self._call("docs"):
                replies = self._rounds(("records", items, ()))[0]
        for h, raw in zip(ask, replies, strict=True):
            if raw is None:  # gone (retention) since its state was read
                if (ref := self._refs.get(h)) is not None:
                    self._final.pop(int.from_bytes(ref, "big"), None)
            else:
                docs[h] = decode_doc(raw, h)
                remember(self._records, h, docs[h], CACHED_RECORDS)
        return docs

    def _write_docs(self, claims: Sequence[Claim], which: list[int]) -> None:
        """The verification records of the keeps among `which`, to the records store."""
        kept = [claims[i] for i in which if claims[i].doc is not None]
        if not kept or self.records is None:
            return

        def write(pipe: Any) -> None:
            for c in kept:
                assert c.doc is not None
                at = self.expire_at(c.probe.page_id)
                pipe.set(self.layout.doc_key(c.probe.page_id), encode_doc(c.doc),
                         exat=at or None)
                remember(self._unkept, c.probe.page_id, None, UNKEPT_HELD)

        self._on_records(write)

    def _forget_docs(self, page_ids: list[int]) -> None:
        """Records written to the records store for pages then dropped (a keep claim lost,
        decided again): nothing reads them; best effort (retention takes what is left)."""
        if not page_ids or self.records is None:
            return
        try:
            self._on_records(lambda pipe: [pipe.delete(self.layout.doc_key(q))
                                           for q in page_ids])
        except IndexUnavailable:
            return
        for q in page_ids:
            self._unkept.pop(q, None)

    def _on_records(self, fill: Callable[[Any], object]) -> list[Any]:
        """One round trip to the records store: the commands `fill` puts in a pipeline."""
        assert self.records is not None
        with self._call("docs"):
            pipe = self.records.pipeline(transaction=False)
            fill(pipe)
            return self._execute(pipe)

    def _finish(self, claims: Sequence[Claim], which: list[int], won: list[bool],
                leave: list[Any]) -> list[Any]:
        """Finish the claims `which` (in the same round trip, `leave`: drops of the round
        before leaving their keys); the drops won now, to leave their keys."""
        if not which:
            return leave
        self._write_docs(claims, which)
        nodes = self._shard_nodes()
        items = []
        for i in which:
            c = claims[i]
            key = self.layout.record_key(c.probe.page_id)
            doc = b"" if c.doc is None or self.records is not None else encode_doc(c.doc)
            items.append((nodes[c.probe.page_id % SHARDS], key, (
                key, b"D" if c.doc is None else b"K", encode_decision(c.decision), doc), 1))
        with self._call("claim"):
            replies = self._rounds(("finish", items, (self.listpack_value,)),
                                   ("leave", leave, ()))[0]
        leave, unkept = [], []
        self.leases.drop(claims[i].probe.page_id for i, reply in zip(which, replies,
                                                                      strict=True)
                         if reply in (b"ok", "ok"))
        for i, reply in zip(which, replies, strict=True):
            c = claims[i]
            won[i] = reply in (b"ok", "ok")
            if won[i]:
                self._finally(c.probe.page_id, "D" if c.doc is None else "K")
                if c.doc is None:  # a dropped page leaves its keys (it reads as DROP; its
                    # ref forgotten, which a batch never is: readers' sweeps take it out)
                    ref = self._refs.get(c.probe.page_id)
                    if ref is not None:
                        joined = self.join_probe(c.probe)
                        leave += self._leave(ref, *self.layout.probe_shards(joined))
                    if c.probe.page_id in self._unkept:
                        unkept.append(c.probe.page_id)
                else:
                    self._unkept.pop(c.probe.page_id, None)
        self._forget_docs(unkept)
        return leave

    def _replaced(self, stored: list[int], in_batch: Mapping[int, Probe]
                  ) -> list[tuple[int, Probe | None]]:
        """Versions to retire, each with its keys as its probe gave them: `in_batch`'s
        known, `stored`'s from their verification records (None: gone, the record only)."""
        docs = self._docs(list(dict.fromkeys(stored))) if stored else {}
        out: list[tuple[int, Probe | None]] = [(q, self.join_probe(p))
                                               for q, p in in_batch.items()]
        out += [(q, doc_probe(docs[q]) if q in docs else None) for q in stored]
        return out

    def _retire(self, versions: list[tuple[int, Probe | None]], leave: list[Any],
                count: int, exact: bool = False) -> dict[int, bytes]:
        """One round trip: each version's record KEEP -> R (its verification record in the
        index's Redis deleted with it) and its ref leaves its keys; also `leave` (drops
        leaving theirs) and the count of pages held by `count`. Then the records store
        forgets theirs (best effort) and the caches do. `exact`: `count` took one off for
        each version; one another call retired first (R: a forget and a new version of its
        URL at once) is given back, so each KEEP -> R counts once. The versions retired
        (KEEP -> R by this call), with their refs."""
        nodes = self._shard_nodes()
        items = []
        unknown: list[tuple[int, Probe]] = []  # versions whose refs this instance forgot
        for q, probe in versions:
            key = self.layout.record_key(q)
            items.append((nodes[q % SHARDS], key, (key,), 1))
            if probe is not None:
                ref = self._refs.get(q)
                if ref is None:
                    unknown.append((q, probe))
                else:
                    leave = leave + self._leave(ref, *self.layout.probe_shards(probe))
        with self._call("claim"):
            found = self._rounds(("leave", leave, ()), ("retire", items, ()), count=count)[1]
        refs = {q: ref for (q, _), (_, ref) in zip(versions, found, strict=True) if ref}
        later = [item for q, probe in unknown if q in refs
                 for item in self._leave(refs[q], *self.layout.probe_shards(probe))]
        # (a state found other than KEEP or gone: not this call's to count)
        back = sum(1 for state, _ in found if _text(state) not in ("ok", "")) if exact else 0
        if later or back:  # (their records give their refs: one more round trip, rarely)
            with self._call("claim"):
                self._rounds(("leave", later, ()), count=back)
        for q, _ in versions:
            self._finally(q, "R", refs.get(q))
            self._records.pop(q, None)
        self._forget_docs([q for q, _ in versions])
        return {q: ref for (q, _), (state, ref) in zip(versions, found, strict=True)
                if _text(state) == "ok"}

    def _leave(self, member: bytes, keys: list[bytes], shards: list[int] | None = None
               ) -> list[Any]:
        """Items of a "leave" call: `member` leaves `keys` (`shards`: theirs, if known)."""
        if shards is None:
            shards = [shard_of(key) for key in keys]
        nodes = self._shard_nodes()
        by_node: dict[Any, list[bytes]] = {}
        for key, shard in zip(keys, shards, strict=True):
            by_node.setdefault(nodes[shard], []).append(key)
        return [(node, node_keys[0], (member, len(node_keys), *node_keys), 0)
                for node, node_keys in by_node.items()]

    # --- plumbing ---------------------------------------------------------------------

def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def remember(cache: OrderedDict[int, Any], key: int, value: Any, limit: int) -> None:
    cache[key] = value
    if len(cache) > limit:
        cache.popitem(last=False)
