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

A lease lasts a few seconds and this instance renews it while it decides the page
(lease.py): a page is waited for exactly as long as its instance is alive and
deciding it; released at once when the instance gives the page up or leaves.

The rounds: reads.py (join and read the sets, peek at the pages seen, wait, sweep)
and pages.py (claim, leave, retire; the records read back). What is stored where:
layout.py; the scripts the server runs: scripts.py; connecting and a round of
script calls: client.py. Forgetting pages online, and what is held per namespace:
forget.py.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from stream_dedup.index.base import (
    WAIT,
    Answer,
    ChainDocs,
    Claim,
    Plan,
    Probe,
    StoredDoc,
    contain_candidates,
    near_candidates,
    weak_candidates,
)
from stream_dedup.index.redis.client import Observe, connect
from stream_dedup.index.redis.forget import Lifecycle
from stream_dedup.index.redis.layout import BUCKETS, FORMAT, SHARDS, Layout, decode_decision
from stream_dedup.index.redis.lease import Leases
from stream_dedup.index.redis.reads import NO_MEMBERS
from stream_dedup.models import position_id
from stream_dedup.security import RedisSecurity

log = logging.getLogger("stream_dedup.index")


def _absent(docs: Any, handle: int) -> bool:
    try:
        docs[handle]
    except (KeyError, IndexError):
        return True
    return False


class RedisIndex(Lifecycle):
    """A FeatureIndex shared by every instance that opens the same Redis."""

    # Its entries expire by themselves (retention_days): Deduplicator.expire skips it
    expires_itself = True

    def __init__(self, url: str, stamp: int, max_posting: int = 64, *,
                 retention_days: float = 0.0, threshold: int = 2, max_candidates: int = 3,
                 groups: int = 6, buckets: int = BUCKETS, records_url: str = "",
                 contain: tuple[int, int, int] = (2, 8, 2), contain_asked: int = 0,
                 observe: Observe | None = None, client: Any = None,
                 security: RedisSecurity | None = None) -> None:
        super().__init__(url, client, observe, security)
        self.stamp = stamp
        self.cap = max_posting
        self.threshold, self.max_candidates = threshold, max_candidates
        self.groups = groups  # a probe's first `groups` keys are features, then bands
        # (containment keys a probe ends with, contain_common, contain_max_candidates)
        self.contain = contain
        # Of those, the last `contain_asked` are asked, not stored (core/sketch.py
        # contain_keys): read, never joined, so a kept page holds what a memory index holds
        self.contain_asked = contain_asked
        self.retention_s = int(retention_days * 86400)
        self.layout = Layout(buckets)
        # Another store for the verification records (None: the index's own): written in a
        # round trip before the records turn KEEP, so no instance finds one KEEP without it.
        self.records = connect(records_url, security) if records_url else None
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
        self._stamp_text = f"{self.stamp}:{SHARDS}:{FORMAT}:{self.layout.buckets}"
        self._check_stamp(self._stamp_text, self.stamp, self.layout.buckets)
        with self._call("stamp"):
            self._load_scripts()
        self._check_config()
        self.interrupted = threading.Event()  # a stop: a page waiting gives up (_wait)
        self.leases = Leases(url, self.layout.record_key, observe, security=security)

    # --- the protocol -----------------------------------------------------------------
    def lookup(self, probes: Sequence[Probe], *, register: bool = True,
               records: Sequence[int] = ()) -> list[Answer]:
        keys, shards = [], []
        for p in probes:
            page_keys, page_shards = self.layout.probe_shards(self.join_probe(p))
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
        asked = self._asked(probes, priors)  # read before the batch joins its keys
        # A page decided before (delivered again) neither joins nor reads: it has its answer.
        joined = Counter(key for page_keys, prior in zip(keys, priors, strict=True)
                         if prior is None for key in page_keys) if register else {}
        refs, hit = self._read(probes, keys, shards, priors, joined if register else None)
        if asked is not None:
            self._with_asked(probes, keys, refs, hit, asked)
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
        members = [[sorted({ids[r] for r in rs if r in ids}) if rs else NO_MEMBERS for rs in sets]
                   for sets in refs]
        states = {ids[r]: state for r, state in by_ref.items() if r in ids}
        mine = {p.page_id for p in probes}
        out: list[Answer] = []
        need: dict[int, None] = dict.fromkeys(records)  # the decide step asked for them
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
            versions = kept.pop() if urls else NO_MEMBERS
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
            self._retire(retired, leave, kept - len(retired), exact=True)
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
    def _register(self, probes: Sequence[Probe]) -> list[Any]:
        """Each page's record PENDING (before any of its keys is joined: a page that sees
        it in a set finds its record), or the decision it already has."""
        nodes = self._shard_nodes()
        items = []
        for p in probes:
            key = self.layout.record_key(p.page_id)
            items.append((nodes[p.page_id % SHARDS], key, (key, self.expire_at(p.page_id)), 1))
        # Held before the round trip: a lease it gives is renewed from then on.
        self.leases.hold(p.page_id for p in probes)
        with self._call("register"):
            found = self._rounds(("register", items,
                                  (self.leases.lease_ms, self.layout.record_buckets)))[0]
        for p, (_, _, ref) in zip(probes, found, strict=True):
            self._know(p.page_id, ref)
        priors = [decode_decision(record, p.page_id) if record else None
                  for p, (_, record, _) in zip(probes, found, strict=True)]
        self.leases.drop(p.page_id for p, prior in zip(probes, priors, strict=True)
                         if prior is not None)
        return priors

    def release(self, page_ids: Sequence[int]) -> None:
        """This instance stops deciding these pages (a batch given up): other instances
        stop waiting for them at once."""
        self.leases.release(page_ids)

    def interrupt(self) -> None:
        """A stop: pages waiting for another instance's give up (IndexUnavailable)."""
        self.interrupted.set()


    def join_probe(self, p: Probe) -> Probe:
        if not self.contain_asked or p.features is None:
            return p
        return Probe(p.page_id, p.raw_fp, p.canonical_fp,
                     p.features[: p.features.shape[0] - self.contain_asked], p.url_key)

    def _wanted(self, answer: Answer) -> list[int]:
        """Handles whose records the decide step may read: the exact hits and the best
        candidates of either tier, as decide/step.py ranks them (the batch's own pages never push
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

    def complete(self, answers: Sequence[Answer]) -> None:
        """Give each answer the record of every page it names that it lacks: answers merged
        from several lookups (namespaces.merge_answers) rank candidates no one lookup
        ranked, and the batch's own pages then change that ranking again."""
        need = {h: None for a in answers if a.prior is None
                for h in [*self._wanted(a), *(h for ids in a.postings for h in ids)]
                if _absent(a.docs, h)}
        if need:
            docs = self._docs(list(need))
            for a in answers:
                if a.prior is None:
                    a.docs = ChainDocs([docs, a.docs])

    def commit(self, offsets: Mapping[str, int] | None = None) -> None:
        pass  # every claim is already stored; the consumer group holds the offsets

    def offsets(self) -> dict[str, int]:
        return {}

    def begin(self, plan: Plan) -> None:
        pass  # a page delivered again gets its recorded decision: no plan needed

    def inflight(self) -> Plan | None:
        return None

    def close(self) -> None:
        self.leases.close()  # the pages still held are released: nobody waits for them
        self.client.close()
        if self.records is not None:
            self.records.close()


