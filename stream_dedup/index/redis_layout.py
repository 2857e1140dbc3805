"""What the Redis index stores, and where: key names, record encodings and the scripts that
run on the server (redis.py holds the client side of the protocol).

Ids are 13 bytes, big-endian `models.position_id`, so ids sort by time. Every key carries one
of SHARDS hash tags, `{n}`, from its fingerprint, feature or page id, so that a cluster
spreads the index evenly over its nodes (a round of the protocol is one script call per node):

    {n}R<raw fp>, {n}C<canonical fp>, {n}F<feature>   sorted set of page ids, each scored by
                                                      when it may go (0: never)
    {n}P<id>   hash: s = state ("P" + lease end in ms | "K" | "D"), f = flagged, j = the
               decision (for re-deliveries), d = the verification record (encode_doc)
    stream-dedup:stamp   "<sketch stamp>:<SHARDS>:<FORMAT>"   stream-dedup:pages   pages kept
"""

from __future__ import annotations

import json
import struct

import numpy as np

from ..models import Decision, DuplicateOf
from .base import Probe, StoredDoc

ID_BYTES = 13  # 98-bit ids (models.position_id)
# Keys are spread over SHARDS hash tags, so a cluster can spread the index evenly over up
# to ~SHARDS / 10 primaries. Part of the layout: every instance must agree (it is stored
# with the stamp).
SHARDS = 1024
FORMAT = 2
STAMP, PAGES = b"stream-dedup:stamp", b"stream-dedup:pages"
# raw fp, canonical fp, text length, sketch values, signature and url bytes (the features
# are not kept: only the keys need them, and a dropped page's keys come from its probe)
_DOC_HEAD = struct.Struct("<QQIHI")
_NO_FEATURES = np.zeros(0, dtype=np.uint64)
_JSON = json.JSONEncoder(separators=(",", ":"))  # (json.dumps builds one per call)

# Every script works on many keys of ONE node: a round of the protocol is one pipelined
# call per node (not per key, nor per hash tag). A cluster lets a script declare keys of
# one slot only, so the keys travel in ARGV, each followed by its values (a fixed number
# per script), and KEYS[1], one of them, only routes the call; the flag lets the script
# touch keys of every slot the node serves (a slot that moved meanwhile fails the call:
# the batch is tried again once the client knows the new owner).
_FLAGS = "#!lua flags=allow-cross-slot-keys\n"
_LUA_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# Sets. ARGV: how many members to read of a feature (F, its newest) and of an exact layer
# (R, C: its oldest, by expiry then id; without retention, by id) besides the batch's own
# members of the key; how many keys have other than 1 of those, then each such key and its
# number; then per page: its member, its expiry (epoch s, '0' none), how many of its keys
# follow, the keys. A member's score is its expiry (0: none), so members past theirs go
# first, and the set lives as long as its newest member. Returns, for each key that holds
# members other than the call's own (its pages'), the page's number in the call, the key's
# number among the page's keys (both from 1), and the members read, the call's own among
# them; nothing for the other keys (most: new keys).
_KIND = """
local function newest(key)
  return string.byte(key, string.find(key, '}', 1, true) + 1) == 70
end
"""
_JOIN = _FLAGS + _LUA_NOW + _KIND + """
local nf, nx = tonumber(ARGV[1]), tonumber(ARGV[2])
local mine, i = {}, 4
for _ = 1, tonumber(ARGV[3]) do
  mine[ARGV[i]] = tonumber(ARGV[i + 1])
  i = i + 2
end
local cutoff = '(' .. tostring(math.floor(now / 1000))
local ours, first, n = {}, i, #ARGV
while i <= n do
  ours[ARGV[i]] = true
  i = i + 3 + tonumber(ARGV[i + 2])
end
local out, page = {}, 0
i = first
while i <= n do
  local m, at, last = ARGV[i], ARGV[i + 1], i + 2 + tonumber(ARGV[i + 2])
  page = page + 1
  for j = i + 3, last do
    local key = ARGV[j]
    if at ~= '0' then
      redis.call('ZREMRANGEBYSCORE', key, '(0', cutoff)
    end
    redis.call('ZADD', key, at, m)
    if at ~= '0' then
      redis.call('EXPIREAT', key, at, 'NX')
      redis.call('EXPIREAT', key, at, 'GT')
    end
    if redis.call('ZCARD', key) > 1 then  -- else it holds only this page
      local read
      if newest(key) then
        read = redis.call('ZRANGE', key, '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0,
                          nf + (mine[key] or 1))
      else
        read = redis.call('ZRANGE', key, '-inf', '+inf', 'BYSCORE', 'LIMIT', 0,
                          nx + (mine[key] or 1))
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
  i = last + 1
end
return out
"""

# Sets. ARGV: how many members to read of a feature (its newest) and of an exact layer
# (its oldest, as _JOIN), then the keys. Returns per key the members read.
_READ = _FLAGS + _KIND + """
local nf, nx = ARGV[1], ARGV[2]
local out = {}
for i = 3, #ARGV do
  local key = ARGV[i]
  if newest(key) then
    out[#out + 1] = redis.call('ZRANGE', key, '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, nf)
  else
    out[#out + 1] = redis.call('ZRANGE', key, '-inf', '+inf', 'BYSCORE', 'LIMIT', 0, nx)
  end
end
return out
"""

# Sets; per member that leaves (a dropped page): the member, how many keys follow, the keys.
_LEAVE = _FLAGS + """
local i = 1
while i <= #ARGV do
  local m, last = ARGV[i], i + 1 + tonumber(ARGV[i + 1])
  for j = i + 2, last do redis.call('ZREM', ARGV[j], m) end
  i = last + 1
end
return 0
"""

# Records. ARGV: the lease (ms), then per key: the key, its expiry (epoch s, '0' none).
# Absent, or PENDING (an attempt that did not finish): PENDING again with a new lease.
# Returns per key the state found and the decision if it is final.
_REGISTER = _FLAGS + _LUA_NOW + """
local pending = 'P' .. tostring(now + tonumber(ARGV[1]))
local out = {}
for i = 2, #ARGV, 2 do
  local key, s = ARGV[i], false
  if redis.call('HSETNX', key, 's', pending) == 0 then  -- (1: it was absent, now PENDING)
    s = redis.call('HGET', key, 's')
  end
  if s and string.sub(s, 1, 1) ~= 'P' then
    out[#out + 1] = {s, redis.call('HGET', key, 'j')}
  else
    if s then redis.call('HSET', key, 's', pending) end
    if ARGV[i + 1] ~= '0' then redis.call('EXPIREAT', key, ARGV[i + 1]) end
    out[#out + 1] = {s or '', false}
  end
end
return out
"""

# Records of other pages; per key: '1' to flag it if it is PENDING (a page older than it
# saw it and goes on as if it were not there). Returns per key "K", "D", "P" (pending
# within its lease), "X" (pending past its lease: its instance died) or "" (absent: gone,
# or its record not written yet though its keys are).
_PEEK = _FLAGS + _LUA_NOW + """
local out = {}
for i = 1, #ARGV, 2 do
  local key = ARGV[i]
  local s = redis.call('HGET', key, 's')
  local c = s and string.sub(s, 1, 1) or ''
  if c == 'P' then
    if tonumber(string.sub(s, 2)) < now then
      c = 'X'
    elseif ARGV[i + 1] == '1' then
      redis.call('HSET', key, 'f', '1')
    end
  end
  out[#out + 1] = c
end
return out
"""

# Records; per key: state (K or D), decision JSON, verification record ('' for a drop).
# Only from PENDING within the lease and unflagged; a flag is cleared (read again).
# Returns per key "ok", "flagged", "late" or the state found.
_FINISH = _FLAGS + _LUA_NOW + """
local out = {}
for i = 1, #ARGV, 4 do
  local key = ARGV[i]
  local sf = redis.call('HMGET', key, 's', 'f')
  local s = sf[1]
  if not s or string.sub(s, 1, 1) ~= 'P' then
    out[#out + 1] = s or ''
  elseif tonumber(string.sub(s, 2)) < now then
    out[#out + 1] = 'late'
  elseif sf[2] then
    redis.call('HDEL', key, 'f')
    out[#out + 1] = 'flagged'
  else
    if ARGV[i + 3] == '' then
      redis.call('HSET', key, 's', ARGV[i + 1], 'j', ARGV[i + 2])
    else
      redis.call('HSET', key, 's', ARGV[i + 1], 'j', ARGV[i + 2], 'd', ARGV[i + 3])
    end
    out[#out + 1] = 'ok'
  end
end
return out
"""

# Records; the verification record of each (false: gone).
_RECORDS = _FLAGS + """
local out = {}
for i = 1, #ARGV do out[i] = redis.call('HGET', ARGV[i], 'd') end
return out
"""

SCRIPTS = {"join": _JOIN, "read": _READ, "leave": _LEAVE, "register": _REGISTER,
           "peek": _PEEK, "finish": _FINISH, "records": _RECORDS}


def id_bytes(page_id: int) -> bytes:
    return page_id.to_bytes(ID_BYTES, "big")


_TAGS = [b"{%d}" % shard for shard in range(SHARDS)]
_R, _C, _F = ([tag + kind for tag in _TAGS] for kind in (b"R", b"C", b"F"))
_P = [tag + b"P" for tag in _TAGS]


def record_key(page_id: int) -> bytes:
    return _P[page_id % SHARDS] + page_id.to_bytes(ID_BYTES, "big")


def set_key(kind: bytes, value: int) -> bytes:
    return _TAGS[value % SHARDS] + kind + value.to_bytes(8, "big")


def probe_keys(p: Probe) -> list[bytes]:
    """The sorted sets a page joins: raw, canonical (if it has text), one per feature."""
    return probe_shards(p)[0]


def probe_shards(p: Probe) -> tuple[list[bytes], list[int]]:
    """probe_keys, and the shard (hash tag) of each."""
    shards = [p.raw_fp % SHARDS]
    keys = [_R[shards[0]] + p.raw_fp.to_bytes(8, "big")]
    if p.canonical_fp is not None:
        shard = p.canonical_fp % SHARDS
        shards.append(shard)
        keys.append(_C[shard] + p.canonical_fp.to_bytes(8, "big"))
    if p.features is not None:
        values = p.features.tolist()
        tail = [f % SHARDS for f in values]
        keys += [_F[s] + f.to_bytes(8, "big") for s, f in zip(tail, values, strict=True)]
        shards += tail
    return keys, shards


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
    return _JSON.encode([d.decision, d.reason, d.page_id, dup and dup.page_id, dup and dup.url,
                         d.shared_features, d.resemblance, d.ld_estimate, d.verified,
                         d.short]).encode()


def decode_decision(raw: bytes) -> Decision:
    """A recorded decision, without the url and source (the re-delivered page has them)."""
    kind, reason, page_id, dup_id, dup_url, shared, res, ld, verified, short = json.loads(raw)
    dup = None if dup_id is None else DuplicateOf(dup_id, dup_url)
    return Decision(None, kind, reason, page_id=page_id, duplicate_of=dup,
                    shared_features=shared, resemblance=res, ld_estimate=ld,
                    verified=verified, short=short)
