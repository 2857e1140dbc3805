"""Shared index on Redis (a Redis Cluster, a single Redis, or Kvrocks): N instances decide
as one. The protocol, and why no interleaving of instances breaks it, is in
docs/scale-out.md; in short:

    register   every page of a batch: its record goes from absent to PENDING (with a
               lease); then, in the next round trip,
    join       each page's id joins the set of each of its keys (raw fingerprint,
               canonical fingerprint, each feature, its URL's key), and the set is read in
               the same script call: of two pages sharing a key, the one joining later sees
               the other, whose record is PENDING at least. Then the record of every member
               from another batch is read (peek):
                 KEEP -> a stored page (the decide step may drop against it; in the URL's
                   set: the URL's version);
                 DROP, R (a replaced version), or a lease run out -> nothing;
                 PENDING and younger than the page that saw it -> flagged: it must read
                   again before a claim of it (keep or drop) holds;
                 PENDING and older -> this page waits (it is decided in a later round);
    claim      on the page's own record: PENDING, unflagged and within its lease -> KEEP
               (its verification record written before or with it) or DROP, else the page
               is decided again; a dropped page's id leaves its keys. Then a new version
               retires the one it replaces: KEEP -> R, its record deleted, its id out of
               its keys.

What is stored where, and the scripts the server runs: redis_layout.py; connecting and a
round of script calls: redis_client.py.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..errors import IndexUnavailable
from ..models import position_id
from .base import (
    WAIT,
    Answer,
    Claim,
    Plan,
    Probe,
    StoredDoc,
    contain_candidates,
    near_candidates,
    weak_candidates,
)
from .redis_client import ANY, Observe, ScriptClient, connect, shard_of
from .redis_layout import (
    BUCKETS,
    FORMAT,
    REF_BYTES,
    SHARDS,
    Layout,
    decode_decision,
    decode_doc,
    doc_probe,
    encode_decision,
    encode_doc,
    id_bytes,
)

log = logging.getLogger("stream_dedup.index")

LEASE_MS = 60_000  # a PENDING record no instance finished within this is treated as absent
WAIT_S = 30.0  # how long a page waits for an older one another instance is deciding
CACHED_STATES, CACHED_RECORDS = 1_000_000, 20_000  # final states and kept records cached
CACHED_REFS = 200_000  # refs known (of the pages decided here and of those seen)
# Pages whose records went to the records store before their keep held, at most: one
# left out is one whose keep another instance's copy won (the record is theirs too)
# or whose record, if the page is dropped later, waits for retention instead.
UNKEPT_HELD = 100_000
_READ_SLACK = 32  # members read beyond `cap`: pending, dropped and gone ones are skipped
_EMPTY: list[int] = []


class RedisIndex(ScriptClient):
    """A FeatureIndex shared by every instance that opens the same Redis."""

    def __init__(self, url: str, stamp: int, max_posting: int = 64, *,
                 retention_days: float = 0.0, threshold: int = 2, max_candidates: int = 3,
                 groups: int = 6, buckets: int = BUCKETS, records_url: str = "",
                 contain: tuple[int, int, int] = (2, 8, 2),
                 observe: Observe | None = None, client: Any = None) -> None:
        super().__init__(url, client, observe)
        self.stamp = stamp
        self.cap = max_posting
        self.threshold, self.max_candidates = threshold, max_candidates
        self.groups = groups  # a probe's first `groups` keys are features, then bands
        # (containment keys a probe ends with, contain_common, contain_max_candidates)
        self.contain = contain
        self.retention_s = int(retention_days * 86400)
        self.layout = Layout(buckets)
        # Another store for the verification records (None: the index's own): written in a
        # round trip before the records turn KEEP, so no instance finds one KEEP without it.
        self.records = connect(records_url) if records_url else None
        self._unkept: OrderedDict[int, None] = OrderedDict()  # written there, not kept yet
        # So far: pages told to wait for an older page decided elsewhere, claims lost
        # (decided again): the protocol at work, for benchmarks (and round_trips).
        self.waits = self.lost = 0
        self._waiting: dict[int, float] = {}  # page id -> when it first waited
        # Final states and kept pages' records are cached (bounded; a page gone by retention
        # drops out when its record is found missing). A final state changes once only: a
        # version replaced, KEEP -> R; a URL's set is peeked afresh (a stale KEEP elsewhere
        # is a set read while the version was leaving it: docs/scale-out.md).
        # A page is named in sets by its ref (redis_layout): final states by ref, with the
        # page's id; the refs of pages decided here and seen (page id -> ref).
        self._final: OrderedDict[int, tuple[str, int]] = OrderedDict()
        self._refs: OrderedDict[int, bytes] = OrderedDict()
        self._records: OrderedDict[int, StoredDoc] = OrderedDict()
        self._next_local = position_id(int(time.time() * 1000), random.getrandbits(16), 0)
        self._check_stamp(f"{self.stamp}:{SHARDS}:{FORMAT}:{self.layout.buckets}",
                          self.stamp, self.layout.buckets)
        with self._call("stamp"):
            self._load_scripts()
        self._check_config()

    # --- the protocol -----------------------------------------------------------------
    def lookup(self, probes: Sequence[Probe], *, register: bool = True) -> list[Answer]:
        keys, shards = [], []
        for p in probes:
            page_keys, page_shards = self.layout.probe_shards(p)
            keys.append(page_keys)
            shards.append(page_shards)
        priors: list[Any] = [None] * len(probes)
        if register:
            priors = self._register(probes)
            # A new version decided before: the version it replaced is retired (again: the
            # round that did it may have failed; retiring is idempotent)
            redo = [d.previous.page_id for d in priors if d is not None
                    and d.decision == "keep" and d.previous is not None]
            if redo:
                self._retire(self._replaced(redo, {}), [], 0)
        # A page decided before (delivered again) neither joins nor reads: it has its answer.
        joined = Counter(key for page_keys, prior in zip(keys, priors, strict=True)
                         if prior is None for key in page_keys) if register else {}
        refs, hit = self._read(probes, keys, shards, priors, joined if register else None)
        own = {int.from_bytes(self._refs[p.page_id], "big"): p.page_id
               for p, prior in zip(probes, priors, strict=True) if register and prior is None}
        # Every page of another batch seen (by ref), with the smallest page of this batch
        # that saw it.
        seen: dict[int, int] = {}
        for p, sets, prior, any_read in zip(probes, refs, priors, hit, strict=True):
            if prior is None and any_read:
                for rs in sets:
                    for r in rs:
                        if r not in own:
                            seen[r] = min(seen.get(r, p.page_id), p.page_id)
        # The members of a URL's set: their state is read afresh (a kept version may have
        # been replaced since this instance cached it)
        fresh = {r for p, sets, prior, any_read in zip(probes, refs, priors, hit, strict=True)
                 if p.url_key and prior is None and any_read for r in sets[-1] if r not in own}
        by_ref, ids = self._peek(seen, flag=register, fresh=fresh)
        if register:
            self._sweep([k for k, h in zip(keys, hit, strict=True) if h],
                        [m for m, h in zip(refs, hit, strict=True) if h], by_ref, own)
        # From here on, pages by id (a ref whose page is gone names nothing)
        ids.update(own)
        members = [[sorted({ids[r] for r in rs if r in ids}) if rs else _EMPTY for rs in sets]
                   for sets in refs]
        states = {ids[r]: state for r, state in by_ref.items() if r in ids}
        mine = {p.page_id for p in probes}
        out: list[Answer] = []
        need: dict[int, None] = {}
        waiting = set()
        for p, page_keys, sets, prior, any_read in zip(probes, keys, members, priors, hit,
                                                       strict=True):
            if prior is not None:
                out.append(Answer(None, None, [], {}, prior=prior))
                continue
            exact = 1 if p.canonical_fp is None else 2  # the keys before the features
            urls = 1 if p.url_key else 0  # the URL's key, last
            if not any_read:  # every key new, or holding only pages of this batch
                features = len(page_keys) - exact - urls
                out.append(Answer(None, None, [[] for _ in range(features)], {}))
                continue
            older_pending = any(states.get(q) == "P" and q < p.page_id
                                for ids in sets for q in ids if q not in mine)
            if older_pending and register:
                waiting.add(p.page_id)
                out.append(Answer(None, None, [], {}, prior=WAIT))
                continue
            kept = [[q for q in ids if states.get(q) == "K"] for ids in sets]
            # The URL's kept version: one (two only while a replaced one is being retired,
            # or if its retiring failed: then the newer)
            versions = kept.pop() if urls else _EMPTY
            raw = kept[0][0] if kept[0] else None
            canonical = kept[1][0] if exact == 2 and kept[1] else None
            postings = [ids[-self.cap:] for ids in kept[exact:]]
            answer = Answer(raw, canonical, postings, {}, max(versions) if versions else None)
            # The batch's own kept pages may push the oldest out of a full posting list and
            # so change the ranking the decide step makes: then it may read any candidate.
            feature_keys = page_keys[exact : exact + len(postings)]
            full = any(len(ids) + joined.get(key, 0) > self.cap
                       for ids, key in zip(postings, feature_keys, strict=True))
            wanted = self._wanted(answer)
            if full:
                wanted += [h for ids in postings for h in ids]
            for handle in wanted:
                need[handle] = None
            out.append(answer)
        self.waits += len(waiting)
        if register:  # (a question asked meanwhile, /v1/check, does not reset the clock)
            self._wait(waiting)
        docs = self._docs(list(need))
        while any(h not in docs for h in need):  # some page expired meanwhile: gone
            need = {h: None for answer in out if answer.prior is None
                    for h in self._without(answer, docs, need)}
            docs.update(self._docs([h for h in need if h not in docs]))
        for answer in out:
            if answer.prior is None:
                answer.docs = docs
        return out

    def _without(self, answer: Answer, docs: Mapping[int, StoredDoc],
                 asked: Mapping[int, None]) -> list[int]:
        """Take the pages whose records were asked for and missing out of `answer`; the
        records it needs now."""
        gone = {h for h in asked if h not in docs}
        if answer.raw in gone:
            answer.raw = None
        if answer.canonical in gone:
            answer.canonical = None
        if answer.version in gone:
            answer.version = None
        answer.postings = [[h for h in ids if h not in gone] for ids in answer.postings]
        return self._wanted(answer)

    def claim(self, claims: Sequence[Claim]) -> list[bool]:
        won = [False] * len(claims)
        # A claim that depends on another of the batch (a drop naming a page kept in it, a
        # version replacing one kept in it) is made once that one is won, in a later round.
        after = [c.depends_on if c.depends_on is not None else c.replaces_claim
                 for c in claims]
        todo = [i for i, c in enumerate(claims) if c.decision is not None]
        ready = [i for i in todo if after[i] is None]
        leave: list[Any] = []
        done: set[int] = set()
        while ready:
            leave = self._finish(claims, ready, won, leave)
            done.update(ready)
            ready = [i for i in todo if i not in done and after[i] in done
                     and won[after[i]]]  # type: ignore[index]
        self.lost += sum(1 for c, ok in zip(claims, won, strict=True)
                         if not ok and c.decision is not None)
        kept = sum(1 for c, ok in zip(claims, won, strict=True) if ok and c.doc is not None)
        # Versions replaced by the new ones won (only now: a keep that lost replaces nothing)
        stored = [c.replaces for c, ok in zip(claims, won, strict=True)
                  if ok and c.doc is not None and c.replaces is not None]
        retired = self._replaced(stored, {
            claims[j].probe.page_id: claims[j].probe for c, ok in zip(claims, won, strict=True)
            if ok and c.doc is not None and (j := c.replaces_claim) is not None})
        # The last drops leave their keys, the replaced versions are retired, and the count
        # of pages held changes, in one round trip (none orders anything: a drop leaves
        # after its record is final; a version is retired after the new one is KEEP).
        if leave or kept or retired:
            self._retire(retired, leave, kept - len(retired))
        return won

    def stored(self, raw_fps: Sequence[int]) -> list[bool]:
        """Whether a page with each raw fingerprint may be held (a hint: one round trip)."""
        nodes = self._shard_nodes()
        items = []
        for fp in raw_fps:
            key = self.layout.set_key(b"r", fp)
            items.append((nodes[fp % SHARDS], key, (key,), 1))
        with self._call("read"):
            found = self._rounds(("read", items, (1, 1)))
        return [bool(members) for members in found[0]]

    def local_ids(self, n: int) -> range:
        """Ids for pages without an input position: the clock when this index was opened, a
        random lane, a sequence (unique across instances without a counter; 1 in 65,536
        chance of a clash, only for two processes started in the same millisecond)."""
        start = self._next_local
        self._next_local += n
        return range(start, start + n)

    # --- the rounds -------------------------------------------------------------------
    def expire_at(self, page_id: int) -> int:
        """When a page's keys may go (epoch s): `retention_days` after its crawl time, the
        time in its id (a Kafka record's timestamp; a replay's start), and not within the
        hour (or the window, if shorter): an old page is still held while it and its races
        are being decided. 0: no retention."""
        if not self.retention_s:
            return 0
        now = int(time.time())
        return max((page_id >> 56) // 1000 + self.retention_s, now + min(3600, self.retention_s))

    def _register(self, probes: Sequence[Probe]) -> list[Any]:
        """Each page's record PENDING (before any of its keys is joined: a page that sees
        it in a set finds its record), or the decision it already has."""
        nodes = self._shard_nodes()
        items = []
        for p in probes:
            key = self.layout.record_key(p.page_id)
            items.append((nodes[p.page_id % SHARDS], key, (key, self.expire_at(p.page_id)), 1))
        with self._call("register"):
            found = self._rounds(("register", items,
                                  (LEASE_MS, self.layout.record_buckets)))[0]
        for p, (_, _, ref) in zip(probes, found, strict=True):
            self._know(p.page_id, ref)
        return [decode_decision(record, p.page_id) if record else None
                for p, (_, record, _) in zip(probes, found, strict=True)]

    def _know(self, page_id: int, ref: bytes) -> None:
        _remember(self._refs, page_id, ref, CACHED_REFS)

    def _finally(self, page_id: int, state: str, ref: bytes | None = None) -> None:
        """Remember a page's final state (if its ref is known)."""
        ref = ref or self._refs.get(page_id)
        if ref is not None:
            _remember(self._final, int.from_bytes(ref, "big"), (state, page_id),
                      CACHED_STATES)

    def _read(self, probes: Sequence[Probe], keys: list[list[bytes]], shards: list[list[int]],
              priors: list[Any], joined: Mapping[bytes, int] | None
              ) -> tuple[list[list[list[int]]], list[bool]]:
        """Each key's members, oldest first: exact layers their first few, features their
        most recent `cap`, plus slack for pending and dropped ones. With `joined` (the
        batch's own members per key), each page first joins its keys, in the same script
        call (so of two pages sharing a key, the later call sees the other), and the window
        has room for the batch's members (they would push stored ones out of it); then a
        key that holds only pages of this batch reads as empty. The lists are not to be
        changed (keys read as empty share one). Also, per page, whether any of its keys read
        as other than empty (False: none did)."""
        nodes = self._shard_nodes()
        items: list[tuple[Any, bytes, Sequence[Any], int]] = []
        # per item: its page's sets, the keys' indexes, the page's index
        order: list[tuple[list[list[int]], list[int], int]] = []
        out: list[list[list[int]]] = []
        hit = [joined is None] * len(probes)
        for p, page_keys, page_shards, prior in zip(probes, keys, shards, priors, strict=True):
            sets: list[list[int]] = [_EMPTY] * len(page_keys)
            out.append(sets)
            if prior is not None:
                continue
            if joined is None:
                for k, (key, shard) in enumerate(zip(page_keys, page_shards, strict=True)):
                    items.append((nodes[shard], key, (key,), 1))
                    order.append((sets, [k], len(out) - 1))
                continue
            # A page's keys on one node go in one item: its member and expiry once.
            by_node: dict[Any, list[int]] = {}
            for k, shard in enumerate(page_shards):
                by_node.setdefault(nodes[shard], []).append(k)
            member, at = self._refs[p.page_id], self.expire_at(p.page_id)
            for node, ks in by_node.items():
                node_keys = [page_keys[k] for k in ks]
                items.append((node, node_keys[0], (member, at, len(ks), *node_keys), len(ks)))
                order.append((sets, ks, len(out) - 1))
        if joined is None:
            header: Any = (self.cap + _READ_SLACK, _READ_SLACK)
        else:  # keys more than one page of the batch joins, per node
            extra: dict[Any, list[Any]] = {}
            for key, n in joined.items():
                if n != 1:
                    extra.setdefault(nodes[shard_of(key)], []).extend((key, n))
            header = {node: (self.cap + _READ_SLACK, _READ_SLACK, len(kv) // 2, *kv)
                      for node, kv in extra.items()}
            header[ANY] = (self.cap + _READ_SLACK, _READ_SLACK, 0)
        if joined is None:
            with self._call("read"):
                replies = iter(self._rounds(("read", items, header))[0])
            for sets, ks, _ in order:
                for k in ks:
                    sets[k] = sorted(map(int.from_bytes, next(replies)))
        else:
            with self._call("join"):
                found = self._rounds(("join", items, header))[0]
            for i, k, ids in found:
                sets, ks, page = order[i]
                sets[ks[k - 1]] = sorted(map(int.from_bytes, ids))
                hit[page] = True
        return out, hit

    def _peek(self, seen: Mapping[int, int], flag: bool, fresh: Collection[int] = ()
              ) -> tuple[dict[int, str], dict[int, int]]:
        """The state and the page id of each page seen, by ref (flagging a younger pending
        one, with `flag`: younger than the page of `seen` that saw it); of those in `fresh`
        a cached KEEP is read again (it may have become R since)."""
        states: dict[int, str] = {}
        ids: dict[int, int] = {}
        for r in seen:
            cached = self._final.get(r)
            if cached is not None and not (cached[0] == "K" and r in fresh):
                states[r], ids[r] = cached
        ask = [r for r in seen if r not in states]
        if not ask:
            return states, ids
        nodes = self._shard_nodes()
        items = []
        for r in ask:
            key = self.layout.ref_key(r)
            items.append((nodes[r % SHARDS], key, (key, id_bytes(seen[r]) if flag else b""), 1))
        with self._call("peek"):
            replies = self._rounds(("peek", items, (self.layout.record_buckets,)))[0]
        for r, (state, page) in zip(ask, replies, strict=True):
            state = states[r] = state.decode() if isinstance(state, bytes) else str(state)
            if page:
                q = ids[r] = int.from_bytes(page, "big")
                self._know(q, r.to_bytes(REF_BYTES, "big"))
                if state in ("K", "D", "R"):
                    _remember(self._final, r, (state, q), CACHED_STATES)
        return states, ids

    def _wait(self, waiting: set[int]) -> None:
        """Pages waiting for an older page decided elsewhere: back off a little (they are
        asked again next round), longer the longer they wait; after WAIT_S the batch is
        given up (decided again later)."""
        now = time.monotonic()
        self._waiting = {p: self._waiting.get(p, now) for p in waiting}
        if not waiting:
            return
        waited = now - min(self._waiting.values())
        if waited > WAIT_S:
            self._waiting = {}
            raise IndexUnavailable(f"{len(waiting)} pages waited {WAIT_S:.0f} s for older "
                                   "pages another instance is deciding")
        time.sleep(min(0.5, 0.01 + waited / 8))

    def _sweep(self, keys: list[list[bytes]], members: list[list[list[int]]],
               states: Mapping[int, str], mine: Collection[int]) -> None:
        """Members of other batches that will never count again leave their sets: drops
        whose own leaving failed, and pages past their lease (an instance that died; one
        that did not joins again when it asks again). Not an absent record: it may be a
        page whose keys were written before its record, in the same round. (By ref.)"""
        gone: dict[int, dict[bytes, None]] = {}
        for page_keys, sets in zip(keys, members, strict=True):
            for key, ids in zip(page_keys, sets, strict=True):
                for q in ids:
                    if q not in mine and states.get(q) in ("X", "D", "R"):
                        gone.setdefault(q, {})[key] = None
        if gone:
            with self._call("sweep"):
                self._rounds(("leave", [item for q, q_keys in gone.items() for item in
                                        self._leave(q.to_bytes(REF_BYTES, "big"),
                                                    list(q_keys))], ()))

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
                _remember(self._records, h, docs[h], CACHED_RECORDS)
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
                _remember(self._unkept, c.probe.page_id, None, UNKEPT_HELD)

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
        for i, reply in zip(which, replies, strict=True):
            c = claims[i]
            won[i] = reply in (b"ok", "ok")
            if won[i]:
                self._finally(c.probe.page_id, "D" if c.doc is None else "K")
                if c.doc is None:  # a dropped page leaves its keys (it reads as DROP; its
                    # ref forgotten, which a batch never is: readers' sweeps take it out)
                    ref = self._refs.get(c.probe.page_id)
                    if ref is not None:
                        leave += self._leave(ref, *self.layout.probe_shards(c.probe))
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
        out: list[tuple[int, Probe | None]] = list(in_batch.items())
        out += [(q, doc_probe(docs[q]) if q in docs else None) for q in stored]
        return out

    def _retire(self, versions: list[tuple[int, Probe | None]], leave: list[Any],
                count: int) -> None:
        """One round trip: each version's record KEEP -> R (its verification record in the
        index's Redis deleted with it) and its ref leaves its keys; also `leave` (drops
        leaving theirs) and the count of pages held by `count`. Then the records store
        forgets theirs (best effort) and the caches do."""
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
        if later:  # (their records give their refs: one more round trip, rarely)
            with self._call("claim"):
                self._rounds(("leave", later, ()))
        for q, _ in versions:
            self._finally(q, "R", refs.get(q))
            self._records.pop(q, None)
        self._forget_docs([q for q, _ in versions])

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
    def _wanted(self, answer: Answer) -> list[int]:
        """Handles whose records the decide step may read: the exact hits and the best
        candidates of either tier, as decide.py ranks them (the batch's own pages never push
        these out): by shared features, or by shared keys (features and band keys)."""
        out = [h for h in (answer.raw, answer.canonical, answer.version) if h is not None]
        keys, common, most = self.contain
        postings = answer.postings
        # One more than the decide step tries: it skips the URL's version (and a version a
        # page of the batch replaced)
        for ranked in (near_candidates(postings, self.groups, self.threshold),
                       weak_candidates(postings[: len(postings) - keys], self.groups)):
            out += [h for h, _ in ranked[: self.max_candidates + 1]]
        if keys:
            out += contain_candidates(postings, keys, common)[: most + 1]
        return out

    def commit(self, offsets: Mapping[str, int] | None = None) -> None:
        pass  # every claim is already stored; the consumer group holds the offsets

    def offsets(self) -> dict[str, int]:
        return {}

    def begin(self, plan: Plan) -> None:
        pass  # a page delivered again gets its recorded decision: no plan needed

    def inflight(self) -> Plan | None:
        return None

    def expire(self, older_than: datetime, limit: int = 10_000) -> int:
        return 0  # keys expire by themselves (retention_days)

    def close(self) -> None:
        self.client.close()
        if self.records is not None:
            self.records.close()


def _remember(cache: OrderedDict[int, Any], key: int, value: Any, limit: int) -> None:
    cache[key] = value
    if len(cache) > limit:
        cache.popitem(last=False)
