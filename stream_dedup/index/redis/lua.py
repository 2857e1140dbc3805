"""What every script of the Redis index starts with (its flag, local aliases, the common
functions). A script names the layout's constants (SHARDS, REF_BYTES, ...); the client puts
their values in when it loads it (client.py `source`)."""

from __future__ import annotations

FLAGS = "#!lua flags=allow-cross-slot-keys\n"
# (a local is found faster than a global's field)
ALIASES = """
local call, find, sub, byte, char = redis.call, string.find, string.sub, string.byte, string.char
"""

COMMON = ALIASES + """
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
