"""Containment keys (Broder 1997: c(A, B) = |S(A) ∩ S(B)| / |S(A)|): a page's smallest
shingles in one random order, as index keys. A kept page stores its bottom k; a page asks
with its bottom q >= k (Sketcher's `contain`, docs/reference.md "Containment"):

- A later page A inside an earlier B (an excerpt) holds each of B's k stored shingles with
  probability ~|A| / |B|, and one it holds is among A's own smallest (A is mostly inside
  B), so among the q it asks with;
- a later page P containing an earlier K (an extended copy) holds K's smallest, and finds
  it among its own q smallest with probability 1 - (1 - |K| / |P|)**q: the asked keys cost
  lookups, not memory.

The order is the bit-reversed top 32 bits of the shingle fingerprints (what a kept page
stores for exact verification, `shingle_tops`): random, since those are hash values, and
the values a MOD-2**s sample keeps come first, so a sampled set has its set's smallest.
"""

from __future__ import annotations

import numpy as np

try:
    from stream_dedup.core import _native
except ImportError:  # installed without a C compiler: the numpy code computes the same
    _native = None  # type: ignore[assignment]

# Containment keys: at most this many asked a page; each is its shingle's place in the
# containment order tagged CONTAIN_TAG in the high half (a 64-bit key like the features').
CONTAIN_MAX = 256
CONTAIN_TAG = np.uint64(0xC0A7_11ED << 32)
# A page with fewer distinct shingles than keys asked fills the rest with keys no page stores
_CONTAIN_NONE = np.uint64(0xC0A7_11EE << 32)
# Deep containment keys: the rest of a kept page's sample (`deep_keys`), tagged apart so
# they meet only the keys a page asks the deep tier with (contain_keys' `again`)
DEEP_TAG = np.uint64(0xC0A7_DEE9 << 32)
_TO_DEEP = CONTAIN_TAG ^ DEEP_TAG  # (a fill key's tag becomes 0xC0A7_DEEA: none)
_CONTAIN_TAG, _NONE_TAG, _DEEP_TAG, _TO_DEEP_INT = (int(t) for t in (
    CONTAIN_TAG, _CONTAIN_NONE, DEEP_TAG, _TO_DEEP))
_REVERSE8 = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], dtype=np.uint8)


def contain_order(tops: np.ndarray) -> np.ndarray:
    """Each 32-bit top, bit-reversed (uint32): a shingle's place in the containment order.
    The tops are hash values, so the order is a random one; reversed, the values a MOD-2**s
    sample keeps (s low bits zero) come first, so a sampled set's smallest are its set's."""
    rev = _REVERSE8[np.ascontiguousarray(tops, dtype="<u4").view(np.uint8)]
    return rev.view("<u4").byteswap()


def contain_keys(tops: bytes, asked: int, again: int = 0) -> np.ndarray:
    """The `asked` smallest distinct shingles of `shingle_tops` bytes in the containment
    order, ascending, as keys (fewer shingles: the rest keys no page stores), then the first
    `again` of them once more as DEEP_TAG keys (a probe's deep-asked keys; fill keys become
    keys of another tag, which no page stores): uint64[asked + again]. The first k are a
    kept page's stored containment keys (Sketcher). The kernel's one pass costs ~1 µs a page
    where numpy's partition costs 14-30."""
    if getattr(_native, "sample_keys", None) is None:  # (an extension built before it)
        keys = contain_keys_numpy(tops, asked)
        return np.concatenate((keys, keys[:again] ^ _TO_DEEP)) if again else keys
    return np.frombuffer(_native.contain_keys(memoryview(tops)[4:], asked, _CONTAIN_TAG,
                                              _NONE_TAG, again, _TO_DEEP_INT), np.uint64)


def sample_keys(tops: bytes, most: int, below: int, tag: int = _CONTAIN_TAG) -> np.ndarray:
    """Up to `most` smallest distinct shingles of `shingle_tops` bytes in the containment
    order that are placed below `below` (a MOD sample: no fill keys), ascending, as keys of
    `tag` (one kernel pass: ~6 µs for 1,000 shingles)."""
    if getattr(_native, "sample_keys", None) is None:
        keys = contain_keys_numpy(tops, most, below)
        keys = keys[: int(np.searchsorted(keys, _CONTAIN_NONE))]
        return keys ^ (CONTAIN_TAG ^ np.uint64(tag))
    return np.frombuffer(_native.sample_keys(memoryview(tops)[4:], most, tag, below),
                         np.uint64)


def contain_keys_numpy(tops: bytes, asked: int, below: int = 1 << 32) -> np.ndarray:
    """`contain_keys` (of the values placed below `below`) in numpy array operations (the
    fallback; tests compare them)."""
    values = np.frombuffer(tops, dtype="<u4", offset=4) if len(tops) > 4 else \
        np.zeros(0, dtype="<u4")
    order = contain_order(values)
    if below < 1 << 32:
        order = order[order < below]
    n = order.shape[0]
    if n > 2 * asked:  # the smallest 2q, then distinct; repeats past q: all of them
        head = np.unique(np.partition(order, 2 * asked)[: 2 * asked + 1])
        if head.shape[0] < asked:
            head = np.unique(order)
    else:
        head = np.unique(order)
    head = head[:asked].astype(np.uint64) | CONTAIN_TAG
    if head.shape[0] < asked:
        fill = np.arange(asked - head.shape[0], dtype=np.uint64) | _CONTAIN_NONE
        head = np.concatenate((head, fill))
    return head


def contain_keys_reference(tops: bytes, asked: int, below: int = 1 << 32) -> list[int]:
    """`contain_keys` in plain Python (tests): sort the distinct bit-reversed tops."""
    n = (len(tops) - 4) // 4 if len(tops) > 4 else 0
    values = {int(f"{int.from_bytes(tops[4 + 4 * i : 8 + 4 * i], 'little'):032b}"[::-1], 2)
              for i in range(n)}
    values = {v for v in values if v < below}
    keys = [v | int(CONTAIN_TAG) for v in sorted(values)[:asked]]
    return keys + [i | int(_CONTAIN_NONE) for i in range(asked - len(keys))]


def deep_keys(tops: bytes, skip: int, rate: int) -> np.ndarray:
    """A kept page's deep containment keys: the containment keys past its first `skip`
    whose place in the order is in the first 1/rate of it (a MOD-rate sample of its
    shingles: every page samples the same values), at most CONTAIN_MAX, as DEEP_TAG keys."""
    if rate <= 0 or len(tops) <= 4:
        return np.zeros(0, np.uint64)
    return sample_keys(tops, CONTAIN_MAX, (1 << 32) // rate, _DEEP_TAG)[skip:]
