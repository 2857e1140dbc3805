"""The Redis index's scripts on record buckets: register, peek, finish, retire and
records (scripts.py has the ones on set buckets and says how every script runs)."""

from __future__ import annotations

from stream_dedup.index.redis.lua import ALIASES, COMMON, FLAGS

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

# Records. ARGV: the lease (ms), record buckets per hash tag, then per key: the key, its
# expiry (epoch s, '0' none). Absent: PENDING with a new ref (the hash tag's count of refs
# given, and the ref's entry in its bucket); PENDING (an attempt that did not finish):
# PENDING again with a new lease, its ref the same (its entries may be in sets). Returns per
# key the state found, the decision if it is final, and the ref.
REGISTER = FLAGS + COMMON + _RECORD + """
local lease, buckets = tostring(now + tonumber(ARGV[1])), tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV, 2 do
  local bucket, field = split(ARGV[i])
  local at = tonumber(ARGV[i + 1])
  local v = record(call('HGET', bucket, field))
  local s = v and sub(v, 1, 1) or ''
  if s == 'K' or s == 'D' or s == 'R' then
    local decision = sub(v, REF_BYTES + 6)
    if decision == '>' then  -- in a key of its own (FINISH)
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
PEEK = FLAGS + COMMON + _RECORD + """
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
FINISH = FLAGS + COMMON + _RECORD + """
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
RETIRE = FLAGS + COMMON + _RECORD + """
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

# Leases. ARGV: the new lease (ms; 0: released), then the keys of pages this instance is
# deciding. Renewed: a PENDING record whose lease has not run out gets a new one; one whose
# lease ran out is left alone (other instances may have gone on as if it were not there, so
# it must register and read again before its claim can hold). Released (a batch given up,
# the instance leaving): a PENDING record's lease ends now, so others read it as past its
# lease at once and its own claim fails. The flag stays. Returns per key 1 (changed) or 0.
LEASE = FLAGS + COMMON + _RECORD + """
local ms, out = tonumber(ARGV[1]), {}
local lease = ms == 0 and '0' or tostring(now + ms)
for i = 2, #ARGV do
  local bucket, field = split(ARGV[i])
  local v = record(call('HGET', bucket, field))
  if v and sub(v, 1, 1) == 'P' and (ms == 0 or lease_end(v) >= now) then
    call('HSET', bucket, field, sub(v, 1, REF_BYTES + 5) .. lease
                                .. (sub(v, -1) == 'f' and 'f' or ''))
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""

# Records; the verification record of each (false: gone).
RECORDS = FLAGS + ALIASES + """
local out = {}
for i = 1, #ARGV do
  local key = ARGV[i]
  local c = find(key, '}', 1, true)
  out[i] = call('GET', sub(key, 1, c) .. 'D' .. sub(key, c + 5))
end
return out
"""

# Record buckets, a scan of the kept pages (forget, namespaces): ARGV: 1 if the verification
# records are in this Redis (else ''), then record buckets. Returns per bucket a list of its
# KEEP pages: the id, then (with records here) the record without its sketch, signature and
# shingle set (its head, then from its features on: redis_layout.decode_light; false: none).
HELD = FLAGS + COMMON + _RECORD + """
local function le(s, p, n)
  local v = 0
  for i = p + n - 1, p, -1 do v = v * 256 + byte(s, i) end
  return v
end
local function light(key)
  local head = call('GETRANGE', key, 0, 40)
  if #head < 41 then return false end
  local skip = 4 * le(head, 21, 2) + le(head, 23, 4) + le(head, 27, 4)
  return head .. call('GETRANGE', key, 41 + skip, -1)
end
local out, here = {}, ARGV[1] ~= ''
for i = 2, #ARGV do
  local bucket = ARGV[i]
  local tag = sub(bucket, 1, find(bucket, '}', 1, true))
  local all, kept = call('HGETALL', bucket), {}
  for j = 1, #all, 2 do
    local f, v = all[j], record(all[j + 1])
    if f ~= '~' and v and sub(v, 1, 1) == 'K' then
      kept[#kept + 1] = f
      if here then kept[#kept + 1] = light(tag .. 'D' .. f) end
    end
  end
  out[#out + 1] = kept
end
return out
"""

RECORD_SCRIPTS = {
    "register": REGISTER, "peek": PEEK, "finish": FINISH, "retire": RETIRE,
    "records": RECORDS, "lease": LEASE, "held": HELD}
