"""Shingles, min-wise sketches and Broder's features (CPM 2000, sections 2-3).

- shingles: every run of w consecutive tokens, fingerprinted to 64 bits;
- sketch: for each of k*s hash permutations pi_i, min(pi_i(S)) over the shingle set S.
  Pr[min pi(A) == min pi(B)] = |A∩B| / |A∪B|, the resemblance, so the share of equal
  positions in two sketches estimates it;
- features: the sketch split into k groups of s; each group (with its group id) is
  fingerprinted by a mix64 chain seeded with the Params stamp: 64 bits, and a hash
  independent of the shingle hash. Two pages share a feature with probability rho**s, and
  "near-duplicate" means sharing >= r of the k features.

Hash families (`Params.family`), all bijections applied to the shingle fingerprints:
- "affine32" (the default): pi_i(x) = a_i*hi(x) + b_i mod 2**32, hi(x) the top 32 bits of
  the fingerprint and a_i odd. A 32-bit multiply-add: twice the lanes of a SIMD register of
  the 64-bit families, so half their cost. The fingerprints are splitmix-mixed, so hi(x) is
  uniform, and two shingles of one page share it with probability ~n**2 / 2**33 (1e-4 at
  n = 2000 shingles), too rarely to move a resemblance estimate.
- "affine64": pi_i(x) = a_i*x + b_i mod 2**64, keeping the top 32 bits of the result.
- "mix64": pi_i(x) = splitmix64(x xor a_i), top 32 bits. Full avalanche, about 3x the cost
  of affine64; use it when in doubt about the inputs.
On random sets, 84 min-hashes of either affine family estimate resemblance with the mean and
spread of 84 independent draws (bench/RESULTS.md, the filter curve).

The min is idempotent, so the sketch of a multiset equals the sketch of its set: repeated
shingles need no de-duplication before sketching.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import xxhash

from stream_dedup.core import ldsig
from stream_dedup.core.contain import CONTAIN_MAX, contain_keys
from stream_dedup.core.hashing import MASK64, U64, golden, mix64, mix64_int, odd_constants
from stream_dedup.errors import ConfigError

try:
    from stream_dedup.core import _native
except ImportError:  # installed without a C compiler: the numpy code computes the same
    _native = None  # type: ignore[assignment]

FAMILIES = ("affine64", "mix64", "affine32")  # the kernel numbers them in this order
_SHIFT32 = U64(32)
_LOW32 = U64(0xFFFFFFFF)
_BLOCK = 4096  # shingles per block: keeps the (k*s, block) temporaries in cache


@dataclass(frozen=True, slots=True)
class Params:
    """Everything that changes what a stored feature or LD signature means. Pages sketched
    under different Params are never compared: `stamp` goes into every feature hash and into
    the index."""

    shingle_words: int = 8
    groups: int = 6
    group_size: int = 14
    seed: int = 0x5EED_D0C5
    family: str = "affine32"
    boilerplate: bool = False
    # Version of what the stages compute beyond these numbers (canonical text, token and
    # feature hashes). 2: multilinear token hash; 3: features by a mix64 chain, not xxh3.
    canon_version: int = 3
    # Coates' signature (c, n): verification compares a page's signature with the stored ones
    ld_c: int = 32
    ld_n: int = 4

    def __post_init__(self) -> None:
        if not 1 <= self.shingle_words <= 64:
            raise ConfigError(f"shingle_words must be in 1..64, got {self.shingle_words}")
        if self.groups < 1 or self.group_size < 1:
            raise ConfigError("groups (k) and group_size (s) must be >= 1")
        if self.groups * self.group_size > 4096:
            raise ConfigError("k*s above 4096 min-hashes is not supported")
        if self.family not in FAMILIES:
            raise ConfigError(f"hash family must be one of {FAMILIES}, got {self.family!r}")
        if self.ld_c < 2 or self.ld_n < 1:
            raise ConfigError("ld_c must be >= 2 and ld_n >= 1")

    @property
    def num_perm(self) -> int:
        return self.groups * self.group_size

    def describe(self) -> str:
        # The LD parameters joined later; at their defaults they are left out, so that the
        # stamps (and the indexes) of the settings that existed before them stay valid.
        ld = "" if (self.ld_c, self.ld_n) == (32, 4) else f",ld={self.ld_c}/{self.ld_n}"
        return (
            f"w={self.shingle_words},k={self.groups},s={self.group_size},seed={self.seed},"
            f"family={self.family},boilerplate={int(self.boilerplate)},canon={self.canon_version}"
            + ld
        )

    @property
    def stamp(self) -> int:
        return xxhash.xxh3_64_intdigest(self.describe().encode())


class Sketcher:
    """Holds the permutation constants for one Params (build once, reuse per page).

    `bands` (b, r): b LSH band keys after the k features, band j a mix64 chain over
    min-hashes j*r .. j*r+r-1 of the same sketch (seeded apart from the features, and by
    the layout: keys of two layouts never meet). Pages of resemblance J share a band with
    probability 1 - (1 - J**r)**b: candidates for verification, not a decision.

    `contain` (k, q): q containment keys after the band keys, the page's q smallest
    shingles in the containment order (core/contain.py), of which a kept page stores the
    first k: an excerpt of half an article is found with chance ~0.94 at k = 4 (two
    min-hashes: 0.75), an article inside a page three times its size at q = 8 with 0.96
    (docs/reference.md, containment)."""

    def __init__(self, params: Params, bands: tuple[int, int] = (0, 1), sets: bool = True,
                 contain: tuple[int, int] = (0, 0), deep: int = 0) -> None:
        self.params = params
        n = params.num_perm
        b, r = bands
        stored, asked = contain
        if b < 0 or r < 1 or b * r > n:
            raise ConfigError(f"bands {b} x band_size {r} need bands >= 0, band_size >= 1 "
                              f"and bands * band_size <= {n} min-hashes")
        if not 0 <= stored <= asked <= CONTAIN_MAX or (stored and not sets):
            raise ConfigError(f"containment keys: {stored} stored, {asked} asked need "
                              f"0 <= stored <= asked <= {CONTAIN_MAX}, and shingle sets")
        self.bands = (b, r)
        self.contain = (stored, asked) if stored else (0, 0)
        self.deep = min(deep, asked) if stored else 0  # asked of the deep tier too
        self.sets = sets  # False: `page` returns no shingle set (b"")
        self._a = odd_constants(params.seed, n, salt=1).reshape(n, 1)
        self._b = odd_constants(params.seed, n, salt=2).reshape(n, 1)
        self._shingle_mult = odd_constants(params.seed, params.shingle_words, salt=3)
        self._feature_seed = params.stamp
        self._band_seed = xxhash.xxh3_64_intdigest(f"bands={b}x{r}:{params.stamp}".encode())
        self._family = FAMILIES.index(params.family)  # the kernel's family number
        self._ld_mult = ldsig.window_constants(0, params.ld_n)

    # --- one page, every step -------------------------------------------------------
    def page(
        self, token_hashes: np.ndarray, codepoints: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
        """(sketch, keys, LD signature, shingles) of a page's tokens and canonical code
        points: `sketch(shingles(token_hashes))`; its k features then its band keys;
        `ldsig.signature(codepoints, ld_c, ld_n)`; and `shingle_tops(shingles, sketch)` (b""
        if not `sets`), in one kernel call (30.9 → 27.7 µs a page on the synthetic crawl,
        before the bands and sets)."""
        p = self.params
        if _native is None:
            x = self.shingles(token_hashes)
            sk = self.sketch(x)
            tops = shingle_tops(x, sk) if self.sets else b""
            return (sk, self.keys(sk, tops), ldsig.signature(codepoints, p.ld_c, p.ld_n),
                    tops)
        sk_b, keys_b, sig, tops = _native.sketch_page(
            np.ascontiguousarray(token_hashes, dtype=np.uint64), self._shingle_mult, self._a,
            self._b, self._family, p.groups, self._feature_seed,
            np.ascontiguousarray(codepoints, dtype=np.uint32), p.ld_c, self._ld_mult,
            *self.bands, self._band_seed, self.sets, SAMPLE_SHINGLES,
        )
        sk = np.frombuffer(sk_b, dtype=np.uint32)
        keys = np.frombuffer(keys_b, dtype=np.uint64)
        tops = _capped(tops)
        if self.contain[0]:
            keys = np.concatenate((keys, contain_keys(tops, self.contain[1], self.deep)))
        return sk, keys, sig, tops

    # --- shingles -----------------------------------------------------------------
    def shingles(self, token_hashes: np.ndarray) -> np.ndarray:
        """64-bit fingerprints of every w-token window (fewer than w tokens: none)."""
        if _native is None:
            return self.shingles_numpy(token_hashes)
        hashes = np.ascontiguousarray(token_hashes, dtype=np.uint64)
        return np.frombuffer(_native.shingles(hashes, self._shingle_mult), dtype=np.uint64)

    def shingles_numpy(self, token_hashes: np.ndarray) -> np.ndarray:
        """`shingles` in numpy array operations (the reference definition)."""
        w = self.params.shingle_words
        n = token_hashes.shape[0] - w + 1
        if n <= 0:
            return np.zeros(0, dtype=np.uint64)
        acc = token_hashes[:n] * self._shingle_mult[0]
        for j in range(1, w):
            acc += token_hashes[j : j + n] * self._shingle_mult[j]
        return mix64(acc)

    # --- sketch -------------------------------------------------------------------
    def sketch(self, shingles: np.ndarray) -> np.ndarray:
        """k*s min-hash values (uint32). An empty set sketches to all 0xFFFFFFFF."""
        if _native is None:
            return self.sketch_numpy(shingles)
        x = np.ascontiguousarray(shingles, dtype=np.uint64)
        return np.frombuffer(_native.minhash(x, self._a, self._b, self._family), dtype=np.uint32)

    def sketch_numpy(self, shingles: np.ndarray) -> np.ndarray:
        """`sketch` in numpy array operations (the reference definition)."""
        out = np.full(self.params.num_perm, 0xFFFFFFFF, dtype=np.uint32)
        if shingles.shape[0] == 0:
            return out
        family = self.params.family
        for lo in range(0, shingles.shape[0], _BLOCK):
            x = shingles[lo : lo + _BLOCK].reshape(1, -1)
            if family == "affine32":
                h = (x >> _SHIFT32) * (self._a & _LOW32)
                h += self._b & _LOW32
                np.minimum(out, (h & _LOW32).min(axis=1).astype(np.uint32), out=out)
                continue
            if family == "affine64":
                h = self._a * x
                h += self._b
            else:
                h = mix64(x ^ self._a)
            # The shift is monotonic: shift the k*s minima, not every hash.
            np.minimum(out, (h.min(axis=1) >> _SHIFT32).astype(np.uint32), out=out)
        return out

    # --- features -----------------------------------------------------------------
    def features(self, sketch: np.ndarray) -> np.ndarray:
        """k 64-bit features. Group g's: h = mix64(seed + (g+1)*golden), then h = mix64(h ^ v)
        for each of its s min-hashes v in order (the kernel computes the same in `page`)."""
        return _chain(sketch, self.params.groups, self.params.group_size, self._feature_seed)

    def keys(self, sketch: np.ndarray, tops: bytes = b"") -> np.ndarray:
        """The k features, then the band keys (the same chain: b groups of r, band seed),
        then the containment keys of the page's `shingle_tops` (asked: q of them)."""
        b, r = self.bands
        parts = [self.features(sketch), _chain(sketch[: b * r], b, r, self._band_seed)]
        if self.contain[0]:
            parts.append(contain_keys(tops, self.contain[1], self.deep))
        return np.concatenate(parts)

    # --- plain reference (tests) ---------------------------------------------------
    @cached_property
    def _ref_constants(self) -> tuple[list[int], list[int], list[int]]:
        return (
            [int(v) for v in self._a.ravel()],
            [int(v) for v in self._b.ravel()],
            [int(v) for v in self._shingle_mult],
        )

    def reference_sketch(self, token_hashes: list[int]) -> list[int]:
        """Slow, obviously-correct sketch: Python ints, explicit sets and loops."""
        a, b, mult = self._ref_constants
        w = self.params.shingle_words
        shingle_set = set()
        for i in range(len(token_hashes) - w + 1):
            acc = sum(token_hashes[i + j] * mult[j] for j in range(w)) & MASK64
            shingle_set.add(mix64_int(acc))
        result = []
        for i in range(self.params.num_perm):
            best = 0xFFFFFFFF
            for x in shingle_set:
                if self.params.family == "affine32":
                    h32 = ((a[i] & 0xFFFFFFFF) * (x >> 32) + (b[i] & 0xFFFFFFFF)) & 0xFFFFFFFF
                elif self.params.family == "affine64":
                    h32 = ((a[i] * x + b[i]) & MASK64) >> 32
                else:
                    h32 = mix64_int(x ^ a[i]) >> 32
                best = min(best, h32)
            result.append(best)
        return result


def _chain(sketch: np.ndarray, groups: int, size: int, seed: int) -> np.ndarray:
    h = mix64(U64(seed) + np.arange(1, groups + 1, dtype=np.uint64) * golden())
    values = np.asarray(sketch, dtype=np.uint32).astype(np.uint64).reshape(groups, size)
    for j in range(size):
        h = mix64(h ^ values[:, j])
    return h


# Past this many shingles a page stores Broder's MOD-m sample of its set (m = 2**s, the values
# = 0 mod m), m the smallest power of two that brings the sketch's estimate of its distinct
# shingles to this many or fewer: a Jaccard of samples of 4,096-8,192 values is off by
# ~sqrt(J (1 - J) / 6,000), 0.005 at 0.8, where whole sets cost twice the bytes and time
# (httpbis's drafts have ~13,500 shingles; its longest 34,258).
SAMPLE_SHINGLES = 1 << 13
# At most about this many values stored (256 KB): a page with more (its shingles repeated far
# more than the estimate sees) keeps the MOD-m sample of its distinct ones (8 MiB of text:
# ~1.5M shingles).
MAX_SET_SHINGLES = 1 << 16


def shingle_tops(shingles: np.ndarray, sketch: np.ndarray | None = None) -> bytes:
    """What a kept page stores for exact verification: a u32 sampling shift s, then the top
    32 bits of each shingle fingerprint = 0 mod 2**s (little-endian; b"" without shingles),
    in text order (never sorted: `jaccard` compares two pages' as stored). s from the
    page's `sketch` past SAMPLE_SHINGLES shingles (the kernel's set_shift; no sketch: 0).
    Two distinct shingles of one page share their top halves with probability
    ~n**2 / 2**33, too rarely to move a Jaccard."""
    x = np.asarray(shingles, dtype=np.uint64)
    if not x.shape[0]:
        return b""
    tops = (x >> _SHIFT32).astype("<u4")
    shift = 0 if sketch is None else _set_shift(sketch, x.shape[0])
    if shift:
        tops = tops[(tops & np.uint32((1 << shift) - 1)) == 0]
    return _capped(np.uint32(shift).astype("<u4").tobytes() + tops.tobytes())


def _set_shift(sketch: np.ndarray, m: int) -> int:
    """The kernel's set_shift: the sample a page of m shingles with this sketch stores."""
    if m <= SAMPLE_SHINGLES:
        return 0
    k, total = sketch.shape[0], int(sketch.astype(np.uint64).sum())
    distinct = min(m, ((k - 1) << 32) // total) if k >= 2 and total else m
    shift = 0
    while shift < 31 and distinct >> shift > SAMPLE_SHINGLES:
        shift += 1
    return shift


def _capped(tops: bytes) -> bytes:
    """`tops` (its shift, then the values), or past MAX_SET_SHINGLES values the MOD-m
    sample of its distinct ones, ascending, with its shift."""
    if len(tops) <= 4 * (MAX_SET_SHINGLES + 1):
        return tops
    shift = int.from_bytes(tops[:4], "little")
    distinct = _distinct(memoryview(tops)[4:])
    while distinct.shape[0] > MAX_SET_SHINGLES:
        shift += 1
        distinct = distinct[(distinct & np.uint32((1 << shift) - 1)) == 0]
    return np.uint32(shift).astype("<u4").tobytes() + distinct.astype("<u4").tobytes()


def _distinct(values: memoryview) -> np.ndarray:
    """Ascending uint32 values, each once."""
    return np.unique(np.frombuffer(values, dtype="<u4"))


def shingle_set(tops: bytes) -> tuple[int, np.ndarray]:
    """(sampling shift, the sorted distinct values) of `shingle_tops` bytes."""
    return int.from_bytes(tops[:4], "little"), _distinct(memoryview(tops)[4:])


def overlap(tops_a: bytes, tops_b: bytes) -> tuple[int, int, int]:
    """(|A|, |B|, |A∩B|) of two pages' `shingle_tops`: exactly, or of their MOD-m samples at
    the coarser page's m (Broder's estimate of resemblance and containment alike). The
    kernel counts them in one pass over each set, without sorting either."""
    mask = (1 << max(int.from_bytes(tops_a[:4], "little"),
                     int.from_bytes(tops_b[:4], "little"))) - 1
    if _native is not None:
        n_a, n_b, common = _native.set_overlap(memoryview(tops_a)[4:], memoryview(tops_b)[4:],
                                               mask)
        return n_a, n_b, common
    a, b = shingle_set(tops_a)[1], shingle_set(tops_b)[1]
    if mask:  # the finer set, sampled as the coarser one was
        a, b = a[(a & np.uint32(mask)) == 0], b[(b & np.uint32(mask)) == 0]
    return a.shape[0], b.shape[0], int(np.intersect1d(a, b, assume_unique=True).shape[0])


def jaccard(tops_a: bytes, tops_b: bytes) -> float | None:
    """|A∩B| / |A∪B| of two pages' `shingle_tops` (see `overlap`); None when a set (or its
    sample) is empty: nothing to tell."""
    n_a, n_b, common = overlap(tops_a, tops_b)
    if n_a == 0 or n_b == 0:
        return None
    return common / (n_a + n_b - common)


def resemblance(sketch_a: np.ndarray, sketch_b: np.ndarray) -> float:
    """Share of equal min-hashes: an unbiased estimate of |A∩B|/|A∪B|."""
    if sketch_a.shape != sketch_b.shape:
        raise ValueError("sketches of different length are not comparable")
    return float(np.count_nonzero(sketch_a == sketch_b)) / int(sketch_a.shape[0])
