"""What every script of the Redis index starts with (its flag, local aliases, the common
functions) and how a script's source gets the layout's constants (redis_scripts.py)."""

from __future__ import annotations

from stream_dedup.index.redis_layout import FEATURE_FIELD, ID_BYTES, REF_BYTES, SHARDS, SWEEP_S

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

_CONSTANTS = {"SWEEP_S": SWEEP_S, "FEATURE_FIELD": FEATURE_FIELD, "ID_BYTES": ID_BYTES,
              "REF_BYTES": REF_BYTES, "SHARDS": SHARDS}


def source(src: str) -> str:
    for name, value in _CONSTANTS.items():
        src = src.replace(name, str(value))
    return src
