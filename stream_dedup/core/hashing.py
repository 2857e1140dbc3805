"""64-bit mixing in numpy, shared by tokens, shingles and LD signatures.

numpy uint64 arithmetic wraps modulo 2**64, which is exactly the ring these mixers are
defined in; the overflow is the point, so it is not an error here.
"""

from __future__ import annotations

import numpy as np

U64 = np.uint64
_M1 = U64(0xBF58476D1CE4E5B9)
_M2 = U64(0x94D049BB133111EB)
_GOLDEN = U64(0x9E3779B97F4A7C15)
MASK64 = (1 << 64) - 1


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a bijection on 64-bit words with full avalanche."""
    x = x ^ (x >> U64(30))
    x = x * _M1
    x = x ^ (x >> U64(27))
    x = x * _M2
    out: np.ndarray = x ^ (x >> U64(31))
    return out


def mix64_int(x: int) -> int:
    """The same bijection on a Python int (reference code and scalars)."""
    x &= MASK64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def odd_constants(seed: int, count: int, salt: int) -> np.ndarray:
    """`count` pseudo-random odd 64-bit constants derived from (seed, salt)."""
    base = (seed * 0x9E3779B97F4A7C15 + salt * 0xD1B54A32D192ED03) & MASK64
    out = [mix64_int(base + i * 0x9E3779B97F4A7C15) | 1 for i in range(1, count + 1)]
    return np.array(out, dtype=np.uint64)


def golden() -> np.uint64:
    return _GOLDEN
