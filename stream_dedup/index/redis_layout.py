"""What the Redis index stores, and where: key names, record encodings and the scripts that
run on the server (redis.py holds the client side of the protocol).

Ids are 13 bytes, big-endian `models.position_id`, so ids sort by time. Every key carries one
of SHARDS hash tags, `{n}`, from its fingerprint, feature or page id, so that a cluster
spreads the index evenly over its nodes (a round of the protocol is one script call per node).
Nothing is a key of its own per page but the verification record: a Redis key costs ~100
bytes of overhead, so the index's entries are *fields* of bucket hashes, `buckets` per hash
tag (fixed when the index is made), each a compact listpack of a few dozen fields:

    {n}S<bucket>  hash; field <feature> (8 bytes), or r/c/u + <raw/canonical fp, URL key>
                  (9): the ids of the pages that have it, sorted (a page's "key": a set
                  of ids; the URL's: its kept version, and pages of it being decided)
    {n}P<bucket>  hash; field <id>: the page's state and expiry, then its lease or (final)
                  its decision (see _COMMON); R: a kept version a newer one replaced
    {n}D<id>      string: a kept page's verification record (encode_doc), ~730 bytes; in
                  the index's Redis or in a records store (redis.py)
    stream-dedup:stamp  "<sketch stamp>:<SHARDS>:<FORMAT>:<buckets>"
    stream-dedup:pages  pages kept

The client names an entry by one *key* string, `{n}S<bucket, 3 bytes><field>` (or P), which
a script splits in two; its hash tag routes it like any key. With retention an entry
carries its own expiry (Redis 7.0 cannot expire a hash's fields): one past it reads as
absent, leaves when its field is written, and a bucket drops all of its own at most every
SWEEP_S (its field `~` holds when next); a bucket expires with its newest entry.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np

from ..models import Contained, Decision, DuplicateOf, Previous
from .base import Probe, StoredDoc

ID_BYTES = 13  # 98-bit ids (models.position_id)
# Keys are spread over SHARDS hash tags, so a cluster can spread the index evenly over up
# to ~SHARDS / 10 primaries. Part of the layout: every instance must agree (it is stored
# with the stamp, with the buckets).
SHARDS = 1024
FORMAT = 5  # 4: records carry the shingle set (exact verification); 5: keys and URL key
BUCKETS = 128  # set buckets per hash tag by default: ~60 fields each at 1M pages held
RECORD_BUCKETS_PER = 8  # a page has 8 set entries (13 with band keys) and one record
# A bucket stays a compact listpack (~25 bytes a field) only up to so many fields of at most
# so many bytes (Redis settings: deploy/redis-local sets these; a warning if lower)
LISTPACK_ENTRIES, LISTPACK_VALUE = 512, 1024
SWEEP_S = 3600  # with retention, how often a bucket drops the entries past their time
STAMP, PAGES = b"stream-dedup:stamp", b"stream-dedup:pages"
# raw fp, canonical fp, text length, sketch values, signature and shingle set bytes, URL
# key, features (and band keys), crawl time bytes, then the url. The features are read
# only to take a replaced version out of its keys (a dropped page's keys: its probe's).
_DOC_HEAD = struct.Struct("<QQIHIIQHB")
_NO_FEATURES = np.zeros(0, dtype=np.uint64)
_JSON = json.JSONEncoder(separators=(",", ":"))  # (json.dumps builds one per call)

# Every script works on many entries of ONE node: a round of the protocol is one pipelined
# call per node (not per key, nor per hash tag). A cluster lets a script declare keys of
# one slot only, so the entries travel in ARGV, each followed by its values (a fixed number
# per script), and KEYS[1], one of them, only routes the call; the flag lets the script
# touch keys of every slot the node serves (a slot that moved meanwhile fails the call:
# the batch is tried again once the client knows the new owner).
_FLAGS = "#!lua flags=allow-cross-slot-keys\n"
_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = tonumber(t[1])
local function split(k)  -- an entry's key: its bucket, its field
  local c = string.find(k, '}', 1, true)
  return string.sub(k, 1, c + 4), string.sub(k, c + 5)
end
local function u32(s, p)
  local a, b, c, d = string.byte(s, p, p + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end
local function be32(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
                     math.floor(n / 256) % 256, n % 256)
end
local function older(a, b)  -- ids a < b, byte by byte (string '<' follows the locale)
  for i = 1, 13 do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end
-- A set entry's value: 'n' then 13-byte ids, or 'e' then ids each with its expiry (4 bytes,
-- epoch s, 0: never), in id order. Returns the ids and expiries not past their time.
local function members(v)
  local ids, exps = {}, {}
  if not v then return ids, exps end
  local w = string.byte(v, 1) == 101 and 17 or 13
  for p = 2, #v, w do
    local e = w == 17 and u32(v, p + 13) or 0
    if e == 0 or e >= nows then
      ids[#ids + 1] = string.sub(v, p, p + 12)
      exps[#exps + 1] = e
    end
  end
  return ids, exps
end
local function packed(ids, exps)
  local timed = false
  for i = 1, #exps do
    if exps[i] ~= 0 then timed = true break end
  end
  local parts = {timed and 'e' or 'n'}
  for i = 1, #ids do
    parts[#parts + 1] = ids[i]
    if timed then parts[#parts + 1] = be32(exps[i]) end
  end
  return table.concat(parts)
end
local function store(bucket, field, ids, exps)
  if #ids == 0 then
    redis.call('HDEL', bucket, field)
  else
    redis.call('HSET', bucket, field, packed(ids, exps))
  end
end
-- A record's value: state ('P', 'K', 'D' or 'R'), its expiry (4 bytes), then for P the
-- lease's end (ms, decimal) and 'f' if flagged, for K, D and R the decision (R: a kept
-- version of a URL that a newer one replaced; final, like D).
local function record(v)  -- false when absent or past its time
  if not v then return false end
  local e = u32(v, 2)
  if e ~= 0 and e < nows then return false end
  return v
end
local function expire(bucket, at)  -- a bucket lives as long as its newest entry
  redis.call('EXPIREAT', bucket, at, 'NX')
  redis.call('EXPIREAT', bucket, at, 'GT')
end
local swept = {}
local function sweep(bucket, is_record)  -- drop every entry past its time, every SWEEP_S
  if swept[bucket] then return end
  swept[bucket] = true
  local due = redis.call('HGET', bucket, '~')
  if due and tonumber(due) > nows then return end
  local all = redis.call('HGETALL', bucket)
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if f ~= '~' then
      if is_record then
        if not record(v) then redis.call('HDEL', bucket, f) end
      else
        local ids, exps = members(v)
        if #ids * (string.byte(v, 1) == 101 and 17 or 13) + 1 ~= #v then
          store(bucket, f, ids, exps)
        end
      end
    end
  end
  redis.call('HSET', bucket, '~', tostring(nows + SWEEP_S))
end
"""

# Sets. ARGV: how many members to read of a feature (its newest) and of an exact layer (its
# oldest) besides the batch's own members of the key; how many keys have other than 1 of
# those, then each such key and its number; then per page: its member, its expiry (epoch s,
# '0' none), how many of its keys follow, the keys. A feature keeps its newest 2 x (read +
# own) members (older ones are never read). Returns, for each key that holds members other
# than the call's own (its pages'), the page's number in the call, the key's number among
# the page's keys (both from 1), and the members read, the call's own among them; nothing
# for the other keys (most: new keys).
_JOIN = _FLAGS + _COMMON + """
local nf, nx = tonumber(ARGV[1]), tonumber(ARGV[2])
local mine, i = {}, 4
for _ = 1, tonumber(ARGV[3]) do
  mine[ARGV[i]] = tonumber(ARGV[i + 1])
  i = i + 2
end
local ours, first, n = {}, i, #ARGV
while i <= n do
  ours[ARGV[i]] = true
  i = i + 3 + tonumber(ARGV[i + 2])
end
local out, page = {}, 0
i = first
while i <= n do
  local m, at, last = ARGV[i], tonumber(ARGV[i + 1]), i + 2 + tonumber(ARGV[i + 2])
  page = page + 1
  for j = i + 3, last do
    local key = ARGV[j]
    local bucket, field = split(key)
    -- Most keys are new: then it holds only this page (one search of the bucket)
    if redis.call('HSETNX', bucket, field, at == 0 and 'n' .. m or 'e' .. m .. be32(at)) == 0 then
      local ids, exps = members(redis.call('HGET', bucket, field))
      local x = #ids + 1
      while x > 1 and not older(ids[x - 1], m) do x = x - 1 end
      if ids[x] == m then
        exps[x] = at
      else
        table.insert(ids, x, m)
        table.insert(exps, x, at)
      end
      local feature, own = #field == 8, mine[key] or 1
      for _ = 1, #ids - (feature and 2 * (nf + own) or #ids) do
        table.remove(ids, 1)
        table.remove(exps, 1)
      end
      store(bucket, field, ids, exps)
      if #ids > 1 then
        local read = {}
        if feature then
          for y = math.max(1, #ids - nf - own + 1), #ids do read[#read + 1] = ids[y] end
        else
          for y = 1, math.min(#ids, nx + own) do read[#read + 1] = ids[y] end
        end
        for _, q in ipairs(read) do
          if not ours[q] then
            out[#out + 1] = page
            out[#out + 1] = j - i - 2
            out[#out + 1] = read
            break
          end
        end
      end
    end
    if at ~= 0 then
      expire(bucket, at)
      sweep(bucket, false)
    end
  end
  i = last + 1
end
return out
"""

# Sets. ARGV: how many members to read of a feature (its newest) and of an exact layer
# (its oldest, as _JOIN), then the keys. Returns per key the members read.
_READ = _FLAGS + _COMMON + """
local nf, nx = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local bucket, field = split(ARGV[i])
  local ids = members(redis.call('HGET', bucket, field))
  local read = {}
  if #field == 8 then
    for x = math.max(1, #ids - nf + 1), #ids do read[#read + 1] = ids[x] end
  else
    for x = 1, math.min(#ids, nx) do read[#read + 1] = ids[x] end
  end
  out[#out + 1] = read
end
return out
"""

# Sets; per member that leaves (a dropped page): the member, how many keys follow, the keys.
_LEAVE = _FLAGS + _COMMON + """
local i = 1
while i <= #ARGV do
  local m, last = ARGV[i], i + 1 + tonumber(ARGV[i + 1])
  for j = i + 2, last do
    local bucket, field = split(ARGV[j])
    local v = redis.call('HGET', bucket, field)
    if v then
      local ids, exps = members(v)
      for x = #ids, 1, -1 do
        if ids[x] == m then
          table.remove(ids, x)
          table.remove(exps, x)
        end
      end
      store(bucket, field, ids, exps)
    end
  end
  i = last + 1
end
return 0
"""

# Records. ARGV: the lease (ms), then per key: the key, its expiry (epoch s, '0' none).
# Absent, or PENDING (an attempt that did not finish): PENDING again with a new lease.
# Returns per key the state found and the decision if it is final.
_REGISTER = _FLAGS + _COMMON + """
local lease = tostring(now + tonumber(ARGV[1]))
local out = {}
for i = 2, #ARGV, 2 do
  local bucket, field = split(ARGV[i])
  local at = tonumber(ARGV[i + 1])
  local pending = 'P' .. be32(at) .. lease
  local found = redis.call('HSETNX', bucket, field, pending) == 0  -- (most: absent, now PENDING)
  local v = found and record(redis.call('HGET', bucket, field))
  local s = v and string.sub(v, 1, 1) or ''
  if s == 'K' or s == 'D' or s == 'R' then
    out[#out + 1] = {s, string.sub(v, 6)}
  else
    if found then  -- pending (a flag stays: it must read again before it may be kept), or gone
      redis.call('HSET', bucket, field, pending .. (v and string.sub(v, -1) == 'f' and 'f' or ''))
    end
    if at ~= 0 then
      expire(bucket, at)
      sweep(bucket, true)
    end
    out[#out + 1] = {s, false}
  end
end
return out
"""

# Records of other pages; per key: '1' to flag it if it is PENDING (a page older than it
# saw it and goes on as if it were not there). Returns per key "K", "D", "R", "P" (pending
# within its lease), "X" (pending past its lease: its instance died) or "" (absent: gone,
# or its record not written yet though its keys are).
_PEEK = _FLAGS + _COMMON + """
local out = {}
for i = 1, #ARGV, 2 do
  local bucket, field = split(ARGV[i])
  local v = record(redis.call('HGET', bucket, field))
  local c = v and string.sub(v, 1, 1) or ''
  if c == 'P' then
    local flagged = string.sub(v, -1) == 'f'
    if tonumber(string.sub(v, 6, flagged and -2 or -1)) < now then
      c = 'X'
    elseif ARGV[i + 1] == '1' and not flagged then
      redis.call('HSET', bucket, field, v .. 'f')
    end
  end
  out[#out + 1] = c
end
return out
"""

# Records; per key: state (K or D), decision, verification record ('' for a drop). Only
# from PENDING within the lease and unflagged; a flag is cleared (read again). The
# verification record is written in the same call, on the same node (same hash tag).
# Returns per key "ok", "flagged", "late" or the state found.
_FINISH = _FLAGS + _COMMON + """
local out = {}
for i = 1, #ARGV, 4 do
  local key = ARGV[i]
  local bucket, field = split(key)
  local v = record(redis.call('HGET', bucket, field))
  if not v or string.sub(v, 1, 1) ~= 'P' then
    out[#out + 1] = v and string.sub(v, 1, 1) or ''
  else
    local flagged = string.sub(v, -1) == 'f'
    if tonumber(string.sub(v, 6, flagged and -2 or -1)) < now then
      out[#out + 1] = 'late'
    elseif flagged then
      redis.call('HSET', bucket, field, string.sub(v, 1, -2))
      out[#out + 1] = 'flagged'
    else
      local expiry = string.sub(v, 2, 5)
      redis.call('HSET', bucket, field, ARGV[i + 1] .. expiry .. ARGV[i + 2])
      if ARGV[i + 3] ~= '' then
        local doc = string.sub(key, 1, string.find(key, '}', 1, true)) .. 'D' .. field
        local at = u32(expiry, 1)
        if at == 0 then
          redis.call('SET', doc, ARGV[i + 3])
        else
          redis.call('SET', doc, ARGV[i + 3], 'EXAT', at)
        end
      end
      out[#out + 1] = 'ok'
    end
  end
end
return out
"""

# Records of kept versions a newer version of their URL replaced: KEEP -> R (the decision
# stays, for re-deliveries), and the verification record in the index's Redis goes in the
# same call (same hash tag). Returns per key "ok", or the state found (R: done before).
_RETIRE = _FLAGS + _COMMON + """
local out = {}
for i = 1, #ARGV do
  local key = ARGV[i]
  local bucket, field = split(key)
  local v = record(redis.call('HGET', bucket, field))
  if v and string.sub(v, 1, 1) == 'K' then
    redis.call('HSET', bucket, field, 'R' .. string.sub(v, 2))
    redis.call('DEL', string.sub(key, 1, string.find(key, '}', 1, true)) .. 'D' .. field)
    out[#out + 1] = 'ok'
  else
    out[#out + 1] = v and string.sub(v, 1, 1) or ''
  end
end
return out
"""

# Records; the verification record of each (false: gone).
_RECORDS = _FLAGS + """
local out = {}
for i = 1, #ARGV do
  local key = ARGV[i]
  local c = string.find(key, '}', 1, true)
  out[i] = redis.call('GET', string.sub(key, 1, c) .. 'D' .. string.sub(key, c + 5))
end
return out
"""

SCRIPTS = {name: src.replace("SWEEP_S", str(SWEEP_S)) for name, src in {
    "join": _JOIN, "read": _READ, "leave": _LEAVE, "register": _REGISTER, "peek": _PEEK,
    "finish": _FINISH, "retire": _RETIRE, "records": _RECORDS}.items()}


def id_bytes(page_id: int) -> bytes:
    return page_id.to_bytes(ID_BYTES, "big")


_TAGS = [b"{%d}" % shard for shard in range(SHARDS)]
_SETS, _RECS = [tag + b"S" for tag in _TAGS], [tag + b"P" for tag in _TAGS]
_RAW, _CANONICAL, _URL = b"r", b"c", b"u"


@dataclass(frozen=True)
class Layout:
    """Where each entry lives, for an index of `buckets` set buckets per hash tag."""

    buckets: int = BUCKETS

    @property
    def record_buckets(self) -> int:
        return max(1, self.buckets // RECORD_BUCKETS_PER)

    def record_key(self, page_id: int) -> bytes:
        bucket = (page_id // SHARDS) % self.record_buckets
        return _RECS[page_id % SHARDS] + bucket.to_bytes(3, "big") + id_bytes(page_id)

    @staticmethod
    def doc_key(page_id: int) -> bytes:
        """The key of a kept page's verification record."""
        return _TAGS[page_id % SHARDS] + b"D" + id_bytes(page_id)

    def set_key(self, kind: bytes, value: int) -> bytes:
        """The entry of a raw (r) or canonical (c) fingerprint, or a feature (b"")."""
        # (the hash tag's shard, a bucket number of 3 bytes, the field)
        bucket = (value // SHARDS) % self.buckets
        return _SETS[value % SHARDS] + bucket.to_bytes(3, "big") + kind + value.to_bytes(8, "big")

    def probe_shards(self, p: Probe) -> tuple[list[bytes], list[int]]:
        """The entries a page joins (raw, canonical if it has text, one per feature, its
        URL's last if it has a URL key), and the shard (hash tag) of each."""
        values = [p.raw_fp]
        kinds = [_RAW]
        if p.canonical_fp is not None:
            values.append(p.canonical_fp)
            kinds.append(_CANONICAL)
        if p.features is not None:
            features = p.features.tolist()
            values += features
            kinds += [b""] * len(features)
        if p.url_key:
            values.append(p.url_key)
            kinds.append(_URL)
        keys = [self.set_key(k, v) for k, v in zip(kinds, values, strict=True)]
        return keys, [v % SHARDS for v in values]


def encode_doc(doc: StoredDoc) -> bytes:
    """The verification record: what the decide step reads of a stored page."""
    fetched = (doc.fetched_at or "").encode("utf-8", "replace")[:255]
    head = _DOC_HEAD.pack(doc.raw_fp, doc.canonical_fp, doc.text_length, doc.sketch.shape[0],
                          len(doc.ld_signature), len(doc.shingles), doc.url_key,
                          doc.features.shape[0], len(fetched))
    return b"".join((head, doc.sketch.astype("<u4").tobytes(), doc.ld_signature,
                     doc.shingles, doc.features.astype("<u8").tobytes(), fetched,
                     doc.url.encode("utf-8", "surrogatepass")))


def decode_doc(raw: bytes, page_id: int) -> StoredDoc:
    raw_fp, canonical_fp, text_length, n, n_sig, n_tops, url_key, n_features, n_fetched = \
        _DOC_HEAD.unpack_from(raw)
    pos = _DOC_HEAD.size
    sketch = np.frombuffer(raw, "<u4", n, pos).astype(np.uint32)
    pos += 4 * n
    sig = bytes(raw[pos : pos + n_sig])
    pos += n_sig
    tops = bytes(raw[pos : pos + n_tops])
    pos += n_tops
    features = (np.frombuffer(raw, "<u8", n_features, pos).astype(np.uint64) if n_features
                else _NO_FEATURES)
    pos += 8 * n_features
    fetched = raw[pos : pos + n_fetched].decode("utf-8", "replace") or None
    url = raw[pos + n_fetched :].decode("utf-8", "surrogatepass")
    return StoredDoc(url, features, sketch, sig, text_length, raw_fp, canonical_fp, fetched,
                     page_id, tops, url_key)


def doc_probe(doc: StoredDoc) -> Probe:
    """A stored page's keys as its own probe gave them (to take them away: a replaced
    version)."""
    return Probe(doc.page_id, doc.raw_fp, doc.canonical_fp if doc.text_length > 0 else None,
                 doc.features, doc.url_key)


# A plain keep (most kept pages) is recorded in one byte: its id is the record's.
_UNIQUE, _SHORT = b"u", b"s"


def encode_decision(d: Decision) -> bytes:
    """What a re-delivery needs to get the same decision (its url, source and fetched_at
    are its own: the page's)."""
    if (d.decision == "keep" and d.reason == "unique" and not d.shared_features
            and d.resemblance is None and d.ld_estimate is None and d.jaccard is None
            and d.previous is None and d.payload_digest is None and not d.contains):
        return _SHORT if d.short else _UNIQUE
    dup, prev = d.duplicate_of, d.previous
    row = [d.decision, d.reason, d.page_id, dup and dup.page_id, dup and dup.url,
           d.shared_features, d.resemblance, d.ld_estimate, d.verified, d.short, d.jaccard]
    if prev is not None or d.payload_digest is not None or d.containment is not None \
            or d.contains:  # recrawls, containment
        row += [prev and [prev.page_id, prev.url, prev.fetched_at, prev.match],
                d.payload_digest, d.containment,
                [[c.page_id, c.url, c.containment] for c in d.contains]]
    return _JSON.encode(row).encode()


def decode_decision(raw: bytes, page_id: int) -> Decision:
    """A recorded decision, without the url, source and fetched_at (the re-delivered page
    has them)."""
    if raw in (_UNIQUE, _SHORT):
        return Decision(None, "keep", "unique", page_id=page_id, short=raw == _SHORT,
                        cluster=page_id)
    row = json.loads(raw)
    kind, reason, pid, dup_id, dup_url, shared, res, ld, verified, short, j = row[:11]
    prev, digest, containment, contains = (*row[11:13], None, []) if len(row) == 13 else \
        row[11:] if len(row) > 11 else (None, None, None, [])
    dup = None if dup_id is None else DuplicateOf(dup_id, dup_url)
    previous = None if prev is None else Previous(*prev)
    # The cluster follows from the rest (decide.py): the page's own id, else its duplicate's,
    # else its URL's version's
    cluster = pid if kind == "keep" else dup.page_id if dup is not None else \
        previous.page_id if previous is not None else None
    return Decision(None, kind, reason, page_id=pid, duplicate_of=dup,
                    shared_features=shared, resemblance=res, ld_estimate=ld, jaccard=j,
                    verified=verified, short=short, previous=previous,
                    payload_digest=digest, containment=containment,
                    contains=tuple(Contained(*c) for c in contains), cluster=cluster)
