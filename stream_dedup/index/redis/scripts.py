"""The scripts the Redis index runs on the server (layout.py says what they read and
write; backend.py calls them, a round of the protocol at a time).

Every script works on many entries of ONE node: a round of the protocol is one pipelined
call per node (not per key, nor per hash tag). A cluster lets a script declare keys of
one slot only, so the entries travel in ARGV, each followed by its values (a fixed number
per script), and KEYS[1], one of them, only routes the call; the flag lets the script
touch keys of every slot the node serves (a slot that moved meanwhile fails the call:
the batch is tried again once the client knows the new owner).
"""

from __future__ import annotations

from stream_dedup.index.redis.lua import COMMON, FLAGS

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

# Sets. ARGV: how many members to read of a feature (its newest) and of an exact layer (its
# oldest) besides the batch's own members of the key; how many keys have other than 1 of
# those, then each such key and its number; then per page: its member, its expiry (epoch s,
# '0' none), how many of its keys follow, the keys, each as two: its bucket, its field (a
# script that splits them costs more than the client that does). A feature keeps its
# newest 2 x (read + own) members (older ones are never read). Returns, for each key that
# holds members other than the call's own (its pages'), the page's number in the call, the
# key's number among the page's keys (both from 1), and the members read, the call's own
# among them; nothing for the other keys (most: new keys).
_JOIN = FLAGS + COMMON + _SETS + """
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
_READ = FLAGS + COMMON + _SETS + """
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
_LEAVE = FLAGS + COMMON + _SETS + """
local i = 1
while i <= #ARGV do
  local m, last = ARGV[i], i + 1 + tonumber(ARGV[i + 1])
  for j = i + 2, last do
    local bucket, field = split(ARGV[j])
    local blob = call('GET', bucket)
    local q = blob and locate(blob, field)
    if q then  -- the member's entry cut out of its set's (adjacent) entries, if there
      local w = #field
      local h, e = layout(blob, w)
      while q <= #blob and sub(blob, q, q + w - 1) == field do
        if sub(blob, q + w, q + w + REF_BYTES - 1) == m then
          save(bucket, sub(blob, 1, q - 1) .. sub(blob, q + e), h)
          break
        end
        q = q + e
      end
    end
  end
  i = last + 1
end
return 0
"""

# Sets; per bucket: the bucket, how many entries follow, the entries (field and ref) to cut
# out of it, in one write (forgotten pages leave their keys a bucket at a time: many of them
# share one).
_CUT = FLAGS + COMMON + _SETS + """
local i = 1
while i <= #ARGV do
  local bucket, n = ARGV[i], tonumber(ARGV[i + 1])
  local blob = call('GET', bucket)
  if blob then
    local h, cut = (layout(blob, 0)), false
    for j = i + 2, i + 1 + n do
      local entry = ARGV[j]
      local _, e = layout(blob, #entry - REF_BYTES)
      local p = h + 1
      while true do
        local q = find(blob, entry, p, true)
        if not q then break end
        if (q - h - 1) % e == 0 then
          blob, cut = sub(blob, 1, q - 1) .. sub(blob, q + e), true
          break
        end
        p = q + 1
      end
    end
    if cut then save(bucket, blob, h) end
  end
  i = i + 2 + n
end
return 0
"""

# the scripts on set buckets (the record scripts: record_scripts.py)
SET_SCRIPTS = {
    "join": _JOIN, "read": _READ, "leave": _LEAVE, "cut": _CUT}
