"""Shared index on Redis (a Redis Cluster, a single Redis, or Kvrocks): N instances decide
as one. The protocol, and why no interleaving of instances breaks it, is in README.md
("Scale-out"); in short:

    register   every page of a batch, before anything is read: its record goes from absent
               to PENDING (with a lease), and its id joins the sorted set of each of its
               keys (raw fingerprint, canonical fingerprint, each feature);
    read       each key's members (after *all* of the batch's registrations: of two pages
               sharing a key, the one that reads last sees the other), then the record of
               every member from another batch:
                 KEEP -> a stored page (the decide step may drop against it);
                 DROP, or a lease run out -> nothing;
                 PENDING and younger than the page that saw it -> flagged: it must read
                   again before it may be kept;
                 PENDING and older -> this page waits (it is decided in a later round);
    claim      a keep is a script on the page's own record: PENDING, unflagged and within
               its lease -> KEEP (with its verification record), else the page is decided
               again; a drop is recorded, and its id leaves its keys.

Keys (ids: 13 bytes, big-endian `models.position_id`, so a set's members sort by time):

    F<feature u64>, R<raw fp u64>, C<canonical fp u64>   sorted set of page ids (score 0)
    P<id>       hash: s = state ("P" + lease end ms | "K" | "D"), f = flagged,
                j = the decision (JSON, for re-deliveries), d = the verification record
    stream-dedup:stamp, stream-dedup:pages                 sketch stamp, pages kept

Every key expires `retention_days` after the crawl time of the newest page in it (see
`expire_at`), and members older than that are trimmed from a set when a page joins it.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import numpy as np
import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisError, ResponseError
from redis.retry import Retry

from ..errors import ConfigError, IndexMismatchError, IndexUnavailable
from ..models import Decision, DuplicateOf, position_id
from .base import WAIT, Answer, Claim, Plan, Probe, StoredDoc, rank_candidates

log = logging.getLogger("stream_dedup.index")

ID_BYTES = 13  # 98-bit ids (models.position_id)
LEASE_MS = 60_000  # a PENDING record no instance finished within this is treated as absent
WAIT_S = 30.0  # how long a page waits for an older one another instance is deciding
_STAMP, _PAGES = b"stream-dedup:stamp", b"stream-dedup:pages"
_READ_SLACK = 16  # members read beyond `cap`: pending and dropped ones are skipped
# raw fp, canonical fp, text length, sketch values, signature and url bytes (the features
# are not kept: only the keys need them, and a dropped page's keys come from its probe)
_DOC_HEAD = struct.Struct("<QQIHI")
_NO_FEATURES = np.zeros(0, dtype=np.uint64)

# KEYS[1] = the page's record. ARGV = lease in ms, expiry (epoch s, 0: none). Absent, or
# PENDING (an attempt that did not finish): PENDING again with a new lease; returns the
# state it found, and the decision if it is final.
_REGISTER = """
local s = redis.call('HGET', KEYS[1], 's')
if s and string.sub(s, 1, 1) ~= 'P' then return {s, redis.call('HGET', KEYS[1], 'j')} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 's', 'P' .. tostring(now + tonumber(ARGV[1])))
if tonumber(ARGV[2]) > 0 then redis.call('EXPIREAT', KEYS[1], ARGV[2]) end
return {s or '', false}
"""

# KEYS[1] = another page's record; ARGV[1] = 1 to flag it if it is PENDING. Returns its
# state: "K", "D", "P" (pending within its lease) or "" (absent, or its lease ran out).
_PEEK = """
local s = redis.call('HGET', KEYS[1], 's')
if not s then return '' end
local c = string.sub(s, 1, 1)
if c ~= 'P' then return c end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(string.sub(s, 2)) < now then return '' end
if ARGV[1] == '1' then redis.call('HSET', KEYS[1], 'f', '1') end
return 'P'
"""

# KEYS[1] = the page's record; ARGV = state (K or D), decision JSON, record (keeps).
# Only from PENDING within the lease and unflagged (a flag is cleared: read again).
_FINISH = """
local s = redis.call('HGET', KEYS[1], 's')
if not s or string.sub(s, 1, 1) ~= 'P' then return s or '' end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(string.sub(s, 2)) < now then return 'late' end
if redis.call('HDEL', KEYS[1], 'f') == 1 then return 'flagged' end
redis.call('HSET', KEYS[1], 's', ARGV[1], 'j', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'd', ARGV[3]) end
return 'ok'
"""


def id_bytes(page_id: int) -> bytes:
    return page_id.to_bytes(ID_BYTES, "big")


def _record_key(page_id: int) -> bytes:
    return b"P" + id_bytes(page_id)


def probe_keys(p: Probe) -> list[bytes]:
    """The sorted sets a page joins: raw, canonical (if it has text), one per feature."""
    keys = [b"R" + p.raw_fp.to_bytes(8, "big")]
    if p.canonical_fp is not None:
        keys.append(b"C" + p.canonical_fp.to_bytes(8, "big"))
    if p.features is not None:
        keys += [b"F" + f.to_bytes(8, "big") for f in p.features.tolist()]
    return keys


def encode_doc(doc: StoredDoc) -> bytes:
    """The verification record: what the decide step reads of a stored page."""
    head = _DOC_HEAD.pack(doc.raw_fp, doc.canonical_fp, doc.text_length, doc.sketch.shape[0],
                          len(doc.ld_signature))
    return b"".join((head, doc.sketch.astype("<u4").tobytes(), doc.ld_signature,
                     doc.url.encode("utf-8", "surrogatepass")))


def decode_doc(raw: bytes, page_id: int) -> StoredDoc:
    raw_fp, canonical_fp, text_length, n, n_sig = _DOC_HEAD.unpack_from(raw)
    pos = _DOC_HEAD.size
    sketch = np.frombuffer(raw, "<u4", n, pos).astype(np.uint32)
    pos += 4 * n
    sig = bytes(raw[pos : pos + n_sig])
    url = raw[pos + n_sig :].decode("utf-8", "surrogatepass")
    return StoredDoc(url, _NO_FEATURES, sketch, sig, text_length, raw_fp, canonical_fp, None,
                     page_id)


def encode_decision(d: Decision) -> bytes:
    """What a re-delivery needs to get the same decision (its url and source are its own)."""
    dup = d.duplicate_of
    return json.dumps([d.decision, d.reason, d.page_id, dup and dup.page_id, dup and dup.url,
                       d.shared_features, d.resemblance, d.ld_estimate, d.verified, d.short],
                      separators=(",", ":")).encode()


def decode_decision(raw: bytes) -> Decision:
    """A recorded decision, without the url and source (the re-delivered page has them)."""
    kind, reason, page_id, dup_id, dup_url, shared, res, ld, verified, short = json.loads(raw)
    dup = None if dup_id is None else DuplicateOf(dup_id, dup_url)
    return Decision(None, kind, reason, page_id=page_id, duplicate_of=dup,
                    shared_features=shared, resemblance=res, ld_estimate=ld,
                    verified=verified, short=short)


def connect(url: str) -> redis.Redis | RedisCluster:
    """A cluster client when the node at `url` is in cluster mode, else a plain one."""
    try:
        plain = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        enabled = plain.info("cluster").get("cluster_enabled", 0)
    except (RedisError, ValueError) as exc:
        raise ConfigError(f"cannot reach Redis at {url}: {exc}") from None
    if not enabled:
        return plain
    plain.close()
    # Few, quick retries here (a moved slot, a reconnect); a longer outage is the runner's
    # to wait out, batch by batch (IndexUnavailable).
    return RedisCluster.from_url(url, socket_timeout=5, socket_connect_timeout=5,
                                 retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2))


Observe = Callable[[str, float, bool], None]  # operation, seconds, failed


class RedisIndex:
    """A FeatureIndex shared by every instance that opens the same Redis."""

    def __init__(self, url: str, stamp: int, max_posting: int = 64, *,
                 retention_days: float = 0.0, threshold: int = 2, max_candidates: int = 3,
                 observe: Observe | None = None, client: Any = None) -> None:
        self.url = url
        self.stamp = stamp
        self.cap = max_posting
        self.threshold, self.max_candidates = threshold, max_candidates
        self.retention_s = int(retention_days * 86400)
        self.observe: Observe = observe or (lambda op, s, failed: None)
        self.client = client if client is not None else connect(url)
        # So far: pipelined round trips, pages told to wait for an older page decided
        # elsewhere, claims lost (decided again): the protocol at work, for benchmarks.
        self.round_trips = self.waits = self.lost = 0
        self._waiting: dict[int, float] = {}  # page id -> when it first waited
        self._local = iter(())  # type: Iterator[int]
        self._check_stamp()

    # --- the protocol -----------------------------------------------------------------
    def lookup(self, probes: Sequence[Probe], *, register: bool = True) -> list[Answer]:
        keys = [probe_keys(p) for p in probes]
        priors: list[Any] = [None] * len(probes)
        if register:
            priors = self._register(probes, keys)
        members = self._read(keys)
        mine = {p.page_id for p in probes}
        # Every page of another batch seen, with the smallest page of this batch that saw it.
        seen: dict[int, int] = {}
        for p, sets, prior in zip(probes, members, priors, strict=True):
            if prior is None:
                for ids in sets:
                    for q in ids:
                        if q not in mine:
                            seen[q] = min(seen.get(q, p.page_id), p.page_id)
        states = self._peek(seen, flag=register)
        out: list[Answer] = []
        need: dict[int, None] = {}
        waiting = set()
        for p, sets, prior in zip(probes, members, priors, strict=True):
            if prior is not None:
                out.append(Answer(None, None, [], {}, prior=prior))
                continue
            older_pending = any(states.get(q) == "P" and q < p.page_id
                                for ids in sets for q in ids if q not in mine)
            if older_pending and register:
                waiting.add(p.page_id)
                out.append(Answer(None, None, [], {}, prior=WAIT))
                continue
            kept = [[q for q in ids if states.get(q) == "K"] for ids in sets]
            raw = kept[0][0] if kept[0] else None
            canonical = None
            postings = kept[1:]
            if p.canonical_fp is not None:
                canonical = kept[1][0] if kept[1] else None
                postings = kept[2:]
            postings = [ids[-self.cap:] for ids in postings]
            answer = Answer(raw, canonical, postings, {})
            for handle in self._wanted(answer):
                need[handle] = None
            out.append(answer)
        self.waits += len(waiting)
        self._wait(waiting, {p.page_id for p in probes} - waiting)
        docs = self._docs(list(need))
        for answer in out:
            if answer.prior is None:
                answer.docs = docs
        return out

    def claim(self, claims: Sequence[Claim]) -> list[bool]:
        won = [False] * len(claims)
        first = [i for i, c in enumerate(claims) if c.decision is not None and (
            c.depends_on is None)]
        self._finish(claims, first, won)
        later = [i for i, c in enumerate(claims) if c.decision is not None
                 and c.depends_on is not None and won[c.depends_on]]
        self._finish(claims, later, won)
        self.lost += sum(1 for c, ok in zip(claims, won, strict=True)
                         if not ok and c.decision is not None)
        kept = sum(1 for c, ok in zip(claims, won, strict=True) if ok and c.doc is not None)
        if kept:
            with self._call("count"):
                self.client.incrby(_PAGES, kept)
        return won

    def local_ids(self, n: int) -> range:
        """Ids for pages without an input position: the clock at the first call, a random
        lane, a sequence (unique across instances without a counter; 1 in 65,536 chance of
        a clash only for two processes started in the same millisecond)."""
        if not hasattr(self, "_next_local"):
            import random
            base = position_id(int(time.time() * 1000), random.getrandbits(16), 0)
            self._next_local = base
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

    def _register(self, probes: Sequence[Probe], keys: list[list[bytes]]) -> list[Any]:
        retention = self.retention_s
        cutoff = b"(" + id_bytes(position_id(int(time.time() * 1000) - retention * 1000, 0, 0))
        with self._call("register"):
            pipe = self.client.pipeline(transaction=False)
            for p, page_keys in zip(probes, keys, strict=True):
                at = self.expire_at(p.page_id)
                pipe.execute_command("EVAL", _REGISTER, 1, _record_key(p.page_id), LEASE_MS, at)
                member = id_bytes(p.page_id)
                for key in page_keys:
                    if retention:  # the members older than the window go first
                        pipe.zremrangebylex(key, b"-", cutoff)
                    pipe.zadd(key, {member: 0})
                    if retention:  # the key lives as long as its newest page
                        pipe.expireat(key, at, nx=True)
                        pipe.expireat(key, at, gt=True)
            replies = self._execute(pipe)
        out: list[Any] = []
        at = 0
        for page_keys in keys:
            state, record = replies[at]
            at += 1 + len(page_keys) * (4 if retention else 1)
            out.append(None if not record else decode_decision(record))
        return out

    def _read(self, keys: list[list[bytes]]) -> list[list[list[int]]]:
        """Each key's members, oldest first: exact layers their first few, features their
        most recent `cap` (plus slack for pending and dropped ones)."""
        with self._call("read"):
            pipe = self.client.pipeline(transaction=False)
            for page_keys in keys:
                for key in page_keys:
                    if key[:1] == b"F":
                        pipe.zrange(key, b"+", b"-", desc=True, bylex=True, offset=0,
                                    num=self.cap + _READ_SLACK)
                    else:
                        pipe.zrange(key, b"-", b"+", bylex=True, offset=0, num=_READ_SLACK)
            replies = iter(self._execute(pipe))
        out = []
        for page_keys in keys:
            sets = []
            for _ in page_keys:
                sets.append(sorted(int.from_bytes(m, "big") for m in next(replies)))
            out.append(sets)
        return out

    def _peek(self, seen: Mapping[int, int], flag: bool) -> dict[int, str]:
        if not seen:
            return {}
        with self._call("peek"):
            pipe = self.client.pipeline(transaction=False)
            for q, smallest in seen.items():
                younger = flag and q > smallest
                pipe.execute_command("EVAL", _PEEK, 1, _record_key(q), "1" if younger else "0")
            replies = self._execute(pipe)
        return {q: r.decode() if isinstance(r, bytes) else str(r)
                for q, r in zip(seen, replies, strict=True)}

    def _wait(self, waiting: set[int], done: set[int]) -> None:
        """Pages waiting for an older page decided elsewhere: back off a little (they are
        asked again next round); too long, and the batch is given up (decided again later)."""
        now = time.monotonic()
        for page_id in done:
            self._waiting.pop(page_id, None)
        if not waiting:
            return
        first = min(self._waiting.setdefault(p, now) for p in waiting)
        if now - first > WAIT_S:
            for p in waiting:
                self._waiting.pop(p, None)
            raise IndexUnavailable(f"{len(waiting)} pages waited {WAIT_S:.0f} s for older "
                                   "pages another instance is deciding")
        time.sleep(min(0.5, 0.005 * 2 ** min(7, len(self._waiting))))

    def _docs(self, handles: list[int]) -> dict[int, StoredDoc]:
        if not handles:
            return {}
        with self._call("docs"):
            pipe = self.client.pipeline(transaction=False)
            for h in handles:
                pipe.hget(_record_key(h), b"d")
            replies = self._execute(pipe)
        return {h: decode_doc(raw, h) for h, raw in zip(handles, replies, strict=True)
                if raw is not None}

    def _finish(self, claims: Sequence[Claim], which: list[int], won: list[bool]) -> None:
        if not which:
            return
        with self._call("claim"):
            pipe = self.client.pipeline(transaction=False)
            for i in which:
                c = claims[i]
                state = b"K" if c.doc is not None else b"D"
                doc = encode_doc(c.doc) if c.doc is not None else b""
                pipe.execute_command("EVAL", _FINISH, 1, _record_key(c.probe.page_id), state,
                                     encode_decision(c.decision), doc)
            replies = self._execute(pipe)
            drops = []
            for i, reply in zip(which, replies, strict=True):
                ok = reply in (b"ok", "ok")
                won[i] = ok
                if ok and claims[i].doc is None:
                    drops.append(claims[i].probe)
            if drops:  # a dropped page leaves its keys (until then it reads as DROP)
                pipe = self.client.pipeline(transaction=False)
                for p in drops:
                    for key in probe_keys(p):
                        pipe.zrem(key, id_bytes(p.page_id))
                self._execute(pipe)

    # --- plumbing ---------------------------------------------------------------------
    def _execute(self, pipe: Any) -> list[Any]:
        self.round_trips += 1
        return list(pipe.execute())

    @contextmanager
    def _call(self, operation: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        except RedisError as exc:
            self.observe(operation, time.perf_counter() - started, True)
            if isinstance(exc, ResponseError) and "OOM" in str(exc):
                raise IndexUnavailable(f"Redis is out of memory ({operation}): {exc}") from exc
            raise IndexUnavailable(f"Redis {operation} failed: {type(exc).__name__}: "
                                   f"{exc}") from exc
        self.observe(operation, time.perf_counter() - started, False)

    def _check_stamp(self) -> None:
        with self._call("stamp"):
            self.client.set(_STAMP, str(self.stamp), nx=True)
            stored = int(self.client.get(_STAMP))
        if stored != self.stamp:
            raise IndexMismatchError(
                f"the Redis index at {self.url} was built with other sketch parameters "
                f"(stamp {stored:#x}, these settings give {self.stamp:#x}); features would "
                "not be comparable. Use the same settings, or another Redis.")

    def _wanted(self, answer: Answer) -> list[int]:
        """Handles whose records the decide step may read: the exact hits and the best
        candidates of either tier (the batch's own pages never push these out)."""
        out = [h for h in (answer.raw, answer.canonical) if h is not None]
        ranked = rank_candidates([h for ids in answer.postings for h in ids], 1)
        out += [h for h, n in ranked if n >= self.threshold][: self.max_candidates]
        out += [h for h, n in ranked if n < self.threshold][: self.max_candidates]
        return out

    def ping(self) -> bool:
        """Can every node answer now (/readyz)?"""
        try:
            with self._call("ping"):
                self.client.ping()
            return True
        except IndexUnavailable:
            return False

    def __len__(self) -> int:
        with self._call("count"):
            return int(self.client.get(_PAGES) or 0)

    def stats(self) -> dict[str, float]:
        """Pages kept, keys, and Redis memory summed over every primary."""
        with self._call("stats"):
            if isinstance(self.client, RedisCluster):
                primaries = RedisCluster.PRIMARIES
                infos = list(self.client.info("memory", target_nodes=primaries).values())
                keys = self.client.dbsize(target_nodes=primaries)  # summed by redis-py
            else:
                infos, keys = [self.client.info("memory")], self.client.dbsize()
        used = sum(int(info["used_memory"]) for info in infos)
        pages = len(self)
        return {"pages": pages, "keys": keys, "redis_used_memory": used,
                "redis_bytes_per_page": used / pages if pages else 0.0}

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
