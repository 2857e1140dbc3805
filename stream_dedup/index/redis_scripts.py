"""The scripts the Redis index runs on the server (redis_layout.py says what they read and
write; redis.py calls them, a round of the protocol at a time).

Every script works on many entries of ONE node: a round of the protocol is one pipelined
call per node (not per key, nor per hash tag). A cluster lets a script declare keys of
one slot only, so the entries travel in ARGV, each followed by its values (a fixed number
per script), and KEYS[1], one of them, only routes the call; the flag lets the script
touch keys of every slot the node serves (a slot that moved meanwhile fails the call:
the batch is tried again once the client knows the new owner).
"""

from __future__ import annotations

from .redis_layout import FEATURE_FIELD, ID_BYTES, REF_BYTES, SHARDS, SWEEP_S

_FLAGS = "#!lua flags=allow-cross-slot-keys\n"
# (a local is found faster than a global's field)
_ALIASES = """
local call, find, sub, byte, char = redis.call, string.find, string.sub, string.byte, string.char
"""

_COMMON = _ALIASES + """
local t = call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nows = tonumber(t[1])
local function split(k)  -- an entry's key: its bucket, its field
  local c = find(k, '}', 1, true)
  return sub(k, 1, c + 4), sub(k, c + 5)
end
local function u32(s, p)
  local a, b, c, d = byte(s, p, p + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end
local function be32(n)
  return char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
              math.floor(n / 256) % 256, n % 256)
end
local function older(a, b)  -- ids (or refs) a < b, byte by byte ('<' follows the locale)
  for i = 1, #a do
    local x, y = byte(a, i), byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end
local function expire(bucket, at)  -- a bucket lives as long as its newest entry
  call('EXPIREAT', bucket, at, 'NX')
  call('EXPIREAT', bucket, at, 'GT')
end
local swept = {}
"""

# A set bucket is a string: 'n', then entries of <field><ref>, or 'e' and when it is swept
# next (4 bytes, epoch s), then entries of <field><ref><expiry (4 bytes, epoch s, 0: never)>
# (a ref names a page in fewer bytes than its id: see redis_layout).
# Every entry of a bucket has one width (its fields do), so a field is found by a search of
# the string (memmem) at an entry's start; a set's members are adjacent, in id order.
_SETS = """
local function layout(blob, w)  -- header bytes, entry bytes
  if byte(blob, 1) == 101 then return 5, w + REF_BYTES + 4 end
  return 1, w + REF_BYTES
end
-- Where `field`'s first entry starts in `blob` (nil: it has none). A search of the string
-- (memmem) finds it wherever it is; a match counts only at an entry's start.
local function locate(blob, field)
  local h, e = layout(blob, #field)
  local p = h + 1
  while true do
    local q = find(blob, field, p, true)
    if not q or (q - h - 1) % e == 0 then return q end
    p = q + 1
  end
end
-- The members of `field` (not past their time), their expiries, and where its entries start
-- and end (exclusive) in `blob` (absent: both at its end; no blob: nil); `q`: where they
-- start, if known (locate).
local function run(blob, field, q)
  if not blob then return {}, {}, nil, nil end
  q = q or locate(blob, field)
  local n = #blob
  if not q then return {}, {}, n + 1, n + 1 end
  local w = #field
  local h, e = layout(blob, w)
  local ids, exps, s = {}, {}, q
  while q <= n and sub(blob, q, q + w - 1) == field do
    local x = h == 5 and u32(blob, q + w + REF_BYTES) or 0
    if x == 0 or x >= nows then
      ids[#ids + 1] = sub(blob, q + w, q + w + REF_BYTES - 1)
      exps[#exps + 1] = x
    end
    q = q + e
  end
  return ids, exps, s, q
end
local function save(bucket, blob, h)
  if #blob == h then
    call('DEL', bucket)
  else
    call('SET', bucket, blob, 'KEEPTTL')
  end
end
-- `blob` with the entries from s to t (exclusive) replaced by field's `ids` (a bucket turns
-- 'e' when an entry has an expiry, and stays so)
local function write(bucket, blob, field, s, t, ids, exps)
  local w = #field
  local timed = blob ~= nil and blob ~= false and byte(blob, 1) == 101
  if not timed then
    for i = 1, #exps do
      if exps[i] ~= 0 then timed = true break end
    end
  end
  if not blob then
    blob = timed and 'e' .. be32(nows + SWEEP_S) or 'n'
    s, t = #blob + 1, #blob + 1
  elseif timed and byte(blob, 1) ~= 101 then  -- each entry gets "never"
    local e, parts = w + REF_BYTES, {'e' .. be32(nows + SWEEP_S)}
    for q = 2, #blob, e do
      parts[#parts + 1] = sub(blob, q, q + e - 1) .. '\\0\\0\\0\\0'
    end
    s, t = 6 + (s - 2) / e * (e + 4), 6 + (t - 2) / e * (e + 4)
    blob = table.concat(parts)
  end
  local parts = {sub(blob, 1, s - 1)}
  for i = 1, #ids do
    parts[#parts + 1] = field
    parts[#parts + 1] = ids[i]
    if timed then parts[#parts + 1] = be32(exps[i]) end
  end
  parts[#parts + 1] = sub(blob, t)
  save(bucket, table.concat(parts), timed and 5 or 1)
end
local function sweep_set(bucket, w)  -- drop every entry past its time, every SWEEP_S
  if swept[bucket] then return end
  swept[bucket] = true
  local blob = call('GET', bucket)
  if not blob or byte(blob, 1) ~= 101 or u32(blob, 2) > nows then return end
  local e, parts = w + REF_BYTES + 4, {'e' .. be32(nows + SWEEP_S)}
  for q = 6, #blob, e do
    local x = u32(blob, q + w + REF_BYTES)
    if x == 0 or x >= nows then parts[#parts + 1] = sub(blob, q, q + e - 1) end
  end
  save(bucket, table.concat(parts), 5)
end
"""

# A record bucket is a hash; field: a page id; value: state ('P', 'K', 'D' or 'R'), its
# expiry (4 bytes), its ref (REF_BYTES), then for P the lease's end (ms, decimal) and 'f' if
# flagged, for K, D and R the decision (R: a kept version of a URL that a newer one
# replaced; final, like D). A ref bucket is a hash; field: a ref; value: the page's id, and
# its expiry (4 bytes) with retention. Both are in the page's hash tag.
_RECORD = """
local function record(v)  -- false when absent or past its time
  if not v then return false end
  local e = u32(v, 2)
  if e ~= 0 and e < nows then return false end
  return v
end
local function lease_end(v)
  return tonumber(sub(v, REF_BYTES + 6, sub(v, -1) == 'f' and -2 or -1))
end
local function be24(n)
  return char(math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
end
local function record_bucket(tag, id, buckets)  -- (Layout.record_key)
  return tag .. 'P' .. be24(math.floor(u32(id, ID_BYTES - 3) / SHARDS) % buckets)
end
local function sweep(bucket, refs)  -- drop every record (ref) past its time, every SWEEP_S
  if swept[bucket] then return end
  swept[bucket] = true
  local due = call('HGET', bucket, '~')
  if due and tonumber(due) > nows then return end
  local all = call('HGETALL', bucket)
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    if f ~= '~' and (refs and #v > ID_BYTES and u32(v, ID_BYTES + 1) < nows
                     or not refs and not record(v)) then
      call('HDEL', bucket, f)
    end
  end
  call('HSET', bucket, '~', tostring(nows + SWEEP_S))
end
"""

# Sets. ARGV: how many members to read of a feature (its newest) and of an exact layer (its
# oldest) besides the batch's own members of the key; how many keys have other than 1 of
# those, then each such key and its number; then per page: its member, its expiry (epoch s,
# '0' none), how many of its keys follow, the keys, each as two: its bucket, its field (a
# script that splits them costs more than the client that does). A feature keeps its
# newest 2 x (read + own) members (older ones are never read). Returns, for each key that
# holds members other than the call's own (its pages'), the page's number in the call, the
# key's number among the page's keys (both from 1), and the members read, the call's own
# among them; nothing for the other keys (most: new keys).
_JOIN = _FLAGS + _COMMON + _SETS + """
local nf, nx = tonumber(ARGV[1]), tonumber(ARGV[2])
local mine, i = {}, 4
for _ = 1, tonumber(ARGV[3]) do
  mine[ARGV[i]] = tonumber(ARGV[i + 1])
  i = i + 2
end
local ours, first, n = {}, i, #ARGV
while i <= n do
  ours[ARGV[i]] = true
  i = i + 3 + 2 * tonumber(ARGV[i + 2])
end
-- Member m joins the set of a key (its bucket, its field), its expiry `at`; the members
-- read if the set holds any besides m (else nil).
local function join(bucket, field, m, at)
  local blob = call('GET', bucket)
  local timed = blob and byte(blob, 1) == 101
  local q = blob and locate(blob, field)
  if not q and (timed or at == 0) then
    -- Most keys are new: the entry goes at the bucket's end (the key has no other to stay
    -- next to). A page that joined before finds its own entry (below): never two. (SET,
    -- not APPEND: an appended string keeps room to grow, up to its length again.)
    if timed then
      call('SET', bucket, blob .. field .. m .. be32(at), 'KEEPTTL')
    else
      call('SET', bucket, (blob or 'n') .. field .. m, 'KEEPTTL')
    end
    return nil
  end
  local ids, exps, s, t = run(blob, field, q)
  local x, same = #ids + 1, false
  while x > 1 and not older(ids[x - 1], m) do x = x - 1 end
  if ids[x] == m then
    same = exps[x] == at  -- joined before with this expiry
    exps[x] = at
  else
    table.insert(ids, x, m)
    table.insert(exps, x, at)
  end
  local feature, own = #field == FEATURE_FIELD, mine[bucket .. field] or 1
  for _ = 1, #ids - (feature and 2 * (nf + own) or #ids) do
    table.remove(ids, 1)
    table.remove(exps, 1)
    same = false
  end
  if not same then write(bucket, blob, field, s, t, ids, exps) end
  if #ids < 2 then return nil end
  local read = {}
  if feature then
    for y = math.max(1, #ids - nf - own + 1), #ids do read[#read + 1] = ids[y] end
  else
    for y = 1, math.min(#ids, nx + own) do read[#read + 1] = ids[y] end
  end
  return read
end
local out, page = {}, 0
i = first
while i <= n do
  local m, at, last = ARGV[i], tonumber(ARGV[i + 1]), i + 2 + 2 * tonumber(ARGV[i + 2])
  page = page + 1
  for j = i + 3, last, 2 do
    local bucket, field = ARGV[j], ARGV[j + 1]
    local read = join(bucket, field, m, at)
    if read then
      for _, q in ipairs(read) do
        if not ours[q] then
          out[#out + 1] = page
          out[#out + 1] = (j - i - 1) / 2
          out[#out + 1] = read
          break
        end
      end
    end
    if at ~= 0 then
      expire(bucket, at)
      sweep_set(bucket, #field)
    end
  end
  i = last + 1
end
return out
"""

# Sets. ARGV: how many members to read of a feature (its newest) and of an exact layer
# (its oldest, as _JOIN), then the keys. Returns per key the members read.
_READ = _FLAGS + _COMMON + _SETS + """
local nf, nx = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local bucket, field = split(ARGV[i])
  local ids = run(call('GET', bucket), field)
  local read = {}
  if #field == FEATURE_FIELD then
    for x = math.max(1, #ids - nf + 1), #ids do read[#read + 1] = ids[x] end
  else
    for x = 1, math.min(#ids, nx) do read[#read + 1] = ids[x] end
  end
  out[#out + 1] = read
end
return out
"""

# Sets; per member that leaves (a dropped page): the member, how many keys follow, the keys.
_LEAVE = _FLAGS + _COMMON + _SETS + """
local i = 1
while i <= #ARGV do
  local m, last = ARGV[i], i + 1 + tonumber(ARGV[i + 1])
  for j = i + 2, last do
    local bucket, field = split(ARGV[j])
    local blob = call('GET', bucket)
    local ids, exps, s, t = run(blob, field)
    if blob and s < t then
      for x = #ids, 1, -1 do
        if ids[x] == m then
          table.remove(ids, x)
          table.remove(exps, x)
        end
      end
      write(bucket, blob, field, s, t, ids, exps)
    end
  end
  i = last + 1
end
return 0
"""

# Records. ARGV: the lease (ms), record buckets per hash tag, then per key: the key, its
# expiry (epoch s, '0' none). Absent: PENDING with a new ref (the hash tag's count of refs
# given, and the ref's entry in its bucket); PENDING (an attempt that did not finish):
# PENDING again with a new lease, its ref the same (its entries may be in sets). Returns per
# key the state found, the decision if it is final, and the ref.
_REGISTER = _FLAGS + _COMMON + _RECORD + """
local lease, buckets = tostring(now + tonumber(ARGV[1])), tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 2 do
  local bucket, field = split(ARGV[i])
  local at = tonumber(ARGV[i + 1])
  local v = record(call('HGET', bucket, field))
  local s = v and sub(v, 1, 1) or ''
  if s == 'K' or s == 'D' or s == 'R' then
    local decision = sub(v, REF_BYTES + 6)
    if decision == '>' then  -- in a key of its own (_FINISH)
      decision = call('GET', sub(bucket, 1, find(bucket, '}', 1, true))
                            .. 'V' .. field)
    end
    out[#out + 1] = {s, decision, sub(v, 6, REF_BYTES + 5)}
  else
    local ref, flag = v and sub(v, 6, REF_BYTES + 5), v and sub(v, -1) == 'f'
    local c = find(bucket, '}', 1, true)
    local tag = sub(bucket, 1, c)
    if not ref then
      local n = call('INCR', tag .. 'N')
      local r = n * SHARDS + tonumber(sub(bucket, 2, c - 1))
      ref = char(math.floor(r / 1099511627776) % 256, math.floor(r / 4294967296) % 256)
            .. be32(r % 4294967296)
      local refs = tag .. 'Q' .. be24(n % buckets)
      call('HSET', refs, ref, at == 0 and field or field .. be32(at))
      if at ~= 0 then
        expire(refs, at)
        sweep(refs, true)
      end
    end
    -- (a flag stays: it must read again before it may be kept)
    call('HSET', bucket, field, 'P' .. be32(at) .. ref .. lease .. (flag and 'f' or ''))
    if at ~= 0 then
      expire(bucket, at)
      sweep(bucket, false)
    end
    out[#out + 1] = {s, false, ref}
  end
end
return out
"""

# Records of other pages, by ref. ARGV: record buckets per hash tag, then per ref: its
# entry's key, and the id of the oldest page that saw it in a set, to flag it if it is
# PENDING and younger (that page goes on as if it were not there; '': no flag). Returns
# per ref its id and state: "K", "D", "R", "P" (pending within its lease), "X" (pending past
# its lease: its instance died) or "" (absent: gone, or its record not written yet though
# its keys are; then no id either, if its ref is gone).
_PEEK = _FLAGS + _COMMON + _RECORD + """
local out, buckets = {}, tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local refs, ref = split(ARGV[i])
  local id = call('HGET', refs, ref)
  if id and #id > ID_BYTES and u32(id, ID_BYTES + 1) < nows then id = false end
  local c = ''
  if id then
    id = sub(id, 1, ID_BYTES)
    local bucket = record_bucket(sub(refs, 1, find(refs, '}', 1, true)), id,
                                 buckets)
    local v = record(call('HGET', bucket, id))
    c = v and sub(v, 1, 1) or ''
    if c == 'P' then
      local seer = ARGV[i + 1]
      if lease_end(v) < now then
        c = 'X'
      elseif seer ~= '' and older(seer, id) and sub(v, -1) ~= 'f' then
        call('HSET', bucket, id, v .. 'f')
      end
    end
  end
  out[#out + 1] = {c, id}
end
return out
"""

# Records. ARGV: the longest record to keep in its bucket (hash-max-listpack-value), then
# per key: state (K or D), decision, verification record ('' for a drop). Only from PENDING
# within the lease and unflagged; a flag is cleared (read again). The verification record
# is written in the same call, on the same node (same hash tag); so is a decision that
# would make the record longer (most drops'), in a key of its own, the record saying '>'.
# Returns per key "ok", "flagged", "late" or the state found.
_FINISH = _FLAGS + _COMMON + _RECORD + """
local out, longest = {}, tonumber(ARGV[1])
for i = 2, #ARGV, 4 do
  local key = ARGV[i]
  local bucket, field = split(key)
  local v = record(call('HGET', bucket, field))
  if not v or sub(v, 1, 1) ~= 'P' then
    out[#out + 1] = v and sub(v, 1, 1) or ''
  else
    if lease_end(v) < now then
      out[#out + 1] = 'late'
    elseif sub(v, -1) == 'f' then
      call('HSET', bucket, field, sub(v, 1, -2))
      out[#out + 1] = 'flagged'
    else
      local expiry, tag = sub(v, 2, 5), sub(key, 1, find(key, '}', 1, true))
      local at, decision = u32(expiry, 1), ARGV[i + 2]
      local function put(k, value)
        if at == 0 then
          call('SET', k, value)
        else
          call('SET', k, value, 'EXAT', at)
        end
      end
      if #decision + REF_BYTES + 5 > longest then
        put(tag .. 'V' .. field, decision)
        decision = '>'
      end
      call('HSET', bucket, field, ARGV[i + 1] .. sub(v, 2, REF_BYTES + 5) .. decision)
      if ARGV[i + 3] ~= '' then put(tag .. 'D' .. field, ARGV[i + 3]) end
      out[#out + 1] = 'ok'
    end
  end
end
return out
"""

# Records of kept versions a newer version of their URL replaced: KEEP -> R (the decision
# stays, for re-deliveries), and the verification record in the index's Redis goes in the
# same call (same hash tag). Returns per key "ok", or the state found (R: done before), and
# its ref (false: no record).
_RETIRE = _FLAGS + _COMMON + _RECORD + """
local out = {}
for i = 1, #ARGV do
  local key = ARGV[i]
  local bucket, field = split(key)
  local v = record(call('HGET', bucket, field))
  local ref = v and sub(v, 6, REF_BYTES + 5)
  if v and sub(v, 1, 1) == 'K' then
    call('HSET', bucket, field, 'R' .. sub(v, 2))
    call('DEL', sub(key, 1, find(key, '}', 1, true)) .. 'D' .. field)
    out[#out + 1] = {'ok', ref}
  else
    out[#out + 1] = {v and sub(v, 1, 1) or '', ref}
  end
end
return out
"""

# Records; the verification record of each (false: gone).
_RECORDS = _FLAGS + _ALIASES + """
local out = {}
for i = 1, #ARGV do
  local key = ARGV[i]
  local c = find(key, '}', 1, true)
  out[i] = call('GET', sub(key, 1, c) .. 'D' .. sub(key, c + 5))
end
return out
"""

_CONSTANTS = {"SWEEP_S": SWEEP_S, "FEATURE_FIELD": FEATURE_FIELD, "ID_BYTES": ID_BYTES,
              "REF_BYTES": REF_BYTES, "SHARDS": SHARDS}


def _source(src: str) -> str:
    for name, value in _CONSTANTS.items():
        src = src.replace(name, str(value))
    return src


SCRIPTS = {name: _source(src) for name, src in {
    "join": _JOIN, "read": _READ, "leave": _LEAVE, "register": _REGISTER, "peek": _PEEK,
    "finish": _FINISH, "retire": _RETIRE, "records": _RECORDS}.items()}
