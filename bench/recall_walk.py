#!/usr/bin/env python3
"""Recall at J8 0.8-0.95 vs bytes a page (issue 16): the near-verified tier's design options.

Every page of the httpbis drafts (revision order) and of the WARC set (tests/test_corpus.py's
order) is analysed ONCE (accuracy.prepare: the engine's Analyzer with default Settings); then
the decide rule is re-played in plain Python over the kept set for each design variant:

    error ─> skip
    raw fingerprint of a kept page ─> drop (exact)         canonical (text) ─> drop (canonical)
    fewer than min_shingles shingles ─> keep (short: only the exact layers know it)
    kept pages sharing >= r = 2 of the 6 features (posting lists of the 64 most recent)
        ─> verify the best 3 (most shared, oldest first): estimate >= 0.80 and LD ratio <= 0.20
           ─> drop (near), else keep
    none ─> the VARIANT's candidates: kept pages sharing >= 1 key among the 6 features and
        its extra LSH bands; best 3 (most keys shared, oldest first) through the VARIANT's
        verifier at its bar ─> drop (near-verified), else keep

A kept page joins the exact layers, the feature and band posting lists and the store of
verification records. The variant "today" (no bands, 84 x 32-bit sketch, LD c = 32, bar
0.85) is the engine's rule; it is checked against the real Deduplicator (default Settings,
one page at a time) on both corpora, page by page (decision and named page).

Definitions:
- bands b x r: band j's key is a mix64 chain over min-hashes j*r .. j*r+r-1 of the SAME 84
  (the features are 6 x 14 of them); stored as a u32 key + u32 page id: 8 B a band a page.
  Two pages with resemblance J share a band with probability 1 - (1 - J^r)^b.
- verifier H x b: the first H min-hashes (84 = the engine's sketch; more are a longer prefix of
  the same affine32 family: Sketcher(Params(groups, group_size)) makes them), each cut to its
  low b bits (b = 32: today). With m of H equal, P_match ~ C + (1 - C) J for C = 2^-b (Li and
  König 2010, b-bit minwise hashing, the large-set form C1 = C2 = 2^-b), so the estimate is
  (m/H - C) / (1 - C); sd = sqrt(P (1 - P) / H) / (1 - C). H*b/8 bytes a page.
  The min-hash's LOW bits are used: the minimum's high bits are mostly 0.
- LD: Coates' signature as the engine stores it (c = 32, one byte a symbol), or c = 64, or the
  same symbols cut to 4 bits (two a byte), or off. Bytes: mean over the corpus' long pages.
- exact J (disk): the kept page's shingle set as an on-disk record (0 B of RAM), read to
  compute J8 itself, bar 0.80 in both tiers; optionally only when a RAM b-bit sketch does not
  rule the pair out first (its "floor": the highest estimate a J = 0.80 pair falls below with
  chance <= 1 %). "disk reads" counts the records read. "on 1/m of shingles": Broder's MOD_m
  sample (fingerprint = 0 mod m) instead of the whole set, J of the two samples.
- the bar of a sketch verifier (theory, not fitted on the corpora): the lowest estimate whose
  chance at J = j_lo is <= 2 % (m ~ Binomial(H, P_match(j_lo))). j_lo = 0.75 by default: for
  84 x 32 bits that is 72/84 = 0.857, the engine's 0.85 (which accepts the same m >= 72), so
  the rule is calibrated on today's choice; "bar@0.78" rows use j_lo = 0.78. The bars are
  checked on synthetic text pairs (accuracy.TextPairs: exact J known) and on the httpbis
  pairs (estimate - J8), then VALIDATED by the replays.
- the near tier (>= 2 features) reads the same stored record: a variant's verifier applies
  there too, at today's 0.80 (an estimate, bias-corrected), so that the record is all there is.
- scores: bench/kept_relative.py's kept-relative precision / drops J8 < 0.5 / recall per
  bucket, on the J8 matrix of our canonical text.
- cost: RAM bytes a page for candidates and verification (8 B a band + the RAM record + the
  LD signature) and the difference with today's 84 x 32-bit sketch (336 B) + LD signature;
  candidates a page reaching the tier gets (what the lookup returns) and verifies (at most 3);
  µs a page in this prototype's candidate lookup and verification (Python dicts and numpy on
  one page at a time, best of 3 walks: an upper bound for the engine's C index), and the
  sketch's extra µs when a variant needs more min-hashes than 84.
- RAM a kept page costs, whole: features 48 B + exact layers 16 B + a fixed row + the design's
  bands and record + the URL (raw, or zlib with a preset dictionary of earlier URLs, measured
  here), against the issue's 256 B; the disk an exact record takes (delta + varint coded).

    python bench/recall_walk.py                      # both corpora, tables + recall_tradeoff.png
    python bench/recall_walk.py --corpus httpbis --synthetic-pairs 400
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from accuracy import Corpus, TextPairs  # noqa: E402
from benchlib import table  # noqa: E402
from kept_relative import DROP, KEEP, SKIP, Outcome, j8_matrix, kept_relative, load, ours  # noqa: E402

from stream_dedup import Settings  # noqa: E402
from stream_dedup.core import ldsig  # noqa: E402
from stream_dedup.core.hashing import U64, golden, mix64  # noqa: E402
from stream_dedup.core.sketch import Params, Sketcher  # noqa: E402

SETTINGS = Settings()
NEAR_BAR = SETTINGS.verify_min_resemblance  # 0.80
TODAY_BAR = SETTINGS.near_verified_min_resemblance  # 0.85
LD_RATIO = SETTINGS.verify_max_ld_ratio  # 0.20
MAX_CANDIDATES = SETTINGS.verify_max_candidates  # 3
CAP = SETTINGS.max_posting  # 64
BAR_J, BAR_ALPHA = 0.75, 0.02
KEY_MASK = 0xFFFFFFFF  # the memory index keeps a key's low 32 bits
PNG = Path(__file__).resolve().parent / "recall_tradeoff.png"


# --- the estimator and its bar (pure) ---------------------------------------------------------


def chance_match(bits: int) -> float:
    """C = 2^-b: two different min-hashes agree on their low b bits (0 for the full 32)."""
    return 0.0 if bits >= 32 else 2.0 ** -bits


def bbit_estimate(matches: int, hashes: int, bits: int) -> float:
    """Resemblance from m of H equal b-bit min-hashes: (m/H - C) / (1 - C), C = 2^-b."""
    c = chance_match(bits)
    return (matches / hashes - c) / (1.0 - c)


def bbit_sd(j: float, hashes: int, bits: int) -> float:
    """Standard deviation of `bbit_estimate` at resemblance j (independent hashes)."""
    c = chance_match(bits)
    p = c + (1.0 - c) * j
    return math.sqrt(p * (1.0 - p) / hashes) / (1.0 - c)


def _binom_pmf(n: int, m: int, p: float) -> float:
    """P(M = m) for M ~ Binomial(n, p), 0 < p < 1 (in logs: n runs to thousands)."""
    log = (math.lgamma(n + 1) - math.lgamma(m + 1) - math.lgamma(n - m + 1)
           + m * math.log(p) + (n - m) * math.log1p(-p))
    return math.exp(log)


def theory_floor(hashes: int, bits: int, j: float = NEAR_BAR, alpha: float = 0.01) -> float:
    """The highest estimate a pair of resemblance j falls below with probability <= alpha
    (a prefilter's bar: it rules out pairs before an exact check)."""
    c = chance_match(bits)
    p = c + (1.0 - c) * j
    below = 0.0
    for m in range(hashes + 1):  # P(M < m + 1), from the bottom
        below += _binom_pmf(hashes, m, p)
        if below > alpha:
            return bbit_estimate(m, hashes, bits)
    return 1.0


def theory_bar(hashes: int, bits: int, j: float = BAR_J, alpha: float = BAR_ALPHA) -> float:
    """The lowest estimate a pair of resemblance j reaches with probability <= alpha."""
    c = chance_match(bits)
    p = c + (1.0 - c) * j
    tail = 0.0
    for m in range(hashes, -1, -1):  # P(M >= m), from the top
        tail += _binom_pmf(hashes, m, p)
        if tail > alpha:
            return bbit_estimate(m + 1, hashes, bits)
    return 0.0


# --- variants ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verifier:
    """What verification reads: H min-hashes of b bits held in RAM, the LD signature, and
    with `exact` the kept page's shingle set, an on-disk record (exact J, the bound of any
    estimate), read only when the RAM min-hashes (if any: H > 0) do not rule it out first."""

    hashes: int = 84
    bits: int = 32
    ld: str = "c32"  # c32 (today) | c64 | nib4 | off
    exact: bool = False
    sample: int = 1  # exact J on the shingles whose fingerprint is 0 mod `sample` (MOD_m)

    @property
    def name(self) -> str:
        ld = {"c32": "LD", "c64": "LD c=64", "nib4": "LD 4-bit", "off": "no LD"}[self.ld]
        sketch = f"{self.hashes}x{self.bits}b"
        if not self.exact:
            return f"{sketch}, {ld}"
        shingles = "" if self.sample == 1 else f" on 1/{self.sample} of shingles"
        return f"exact J{shingles} (disk)" + (f" if {sketch} >= floor" if self.hashes else "")

    def bar(self, j_lo: float = BAR_J) -> float:
        return NEAR_BAR if self.exact else theory_bar(self.hashes, self.bits, j_lo)

    def ram_bytes(self) -> float:
        return self.hashes * self.bits / 8


@dataclass(frozen=True)
class Variant:
    name: str
    bands: tuple[int, int] | None  # (b, r) extra LSH bands over the 84 min-hashes
    verifier: Verifier
    bar: float  # the near-verified tier's bar on the estimate

    def index_bytes(self) -> int:
        return 0 if self.bands is None else 8 * self.bands[0]


TODAY = Variant("today", None, Verifier(), TODAY_BAR)


def design(bands: tuple[int, int] | None, ver: Verifier, j_lo: float = BAR_J) -> Variant:
    """A variant whose bar is the verifier's theory bar for j_lo."""
    name = ver.name if bands is None else f"bands {bands[0]}x{bands[1]}, {ver.name}"
    if j_lo != BAR_J and not ver.exact:
        name += f", bar@{j_lo}"
    return Variant(name, bands, ver, ver.bar(j_lo))


def variants() -> list[Variant]:
    """Candidates (today's verifier), verifiers (today's candidates), then combinations."""
    out = [TODAY]
    for bands in ((3, 4), (5, 4), (6, 5), (8, 5), (12, 7), (14, 6), (21, 4), (28, 3)):
        out.append(design(bands, Verifier()))
    for ver in (Verifier(ld="off"), Verifier(ld="c64"), Verifier(ld="nib4"),
                Verifier(84, 8, "off"), Verifier(84, 4, "off"), Verifier(84, 2, "off"),
                Verifier(84, 1, "off"), Verifier(256, 1, "off"), Verifier(256, 2, "off"),
                Verifier(512, 1, "off"), Verifier(512, 2, "off"), Verifier(0, 0, "off", True)):
        out.append(design(None, ver))
    for bands in ((5, 4), (8, 5)):
        for ver in (Verifier(84, 4, "off"), Verifier(256, 1, "off"), Verifier(256, 2, "off"),
                    Verifier(512, 1, "off"), Verifier(512, 2, "off"), Verifier(0, 0, "off", True),
                    Verifier(84, 4, "off", True), Verifier(256, 2, "off", True)):
            out.append(design(bands, ver))
    for sample in (2, 4, 8):
        out.append(design((5, 4), Verifier(0, 0, "off", True, sample)))
    for j_lo in (0.77, 0.78):
        for ver in (Verifier(84, 4, "off"), Verifier(256, 2, "off"), Verifier(512, 1, "off"),
                    Verifier(512, 2, "off")):
            out.append(design((5, 4), ver, j_lo))
    return out


# --- one corpus, analysed once ----------------------------------------------------------------


@dataclass
class Prepared:
    """What the decide rule reads of each page, from the engine's own analyses."""

    c: Corpus
    status: list[str]  # SKIP, "short" or "long"
    raw_fp: list[int]
    canonical_fp: list[int]
    text_length: list[int]
    feature_keys: list[list[int]]
    sketches: dict[int, np.ndarray]  # hashes -> (pages, hashes) uint32 (0 rows: not long)
    ld: dict[str, list[bytes]]
    ld_c: dict[str, int] = field(default_factory=lambda: {"c32": 32, "c64": 64, "nib4": 32})
    sketch_us: dict[int, float] = field(default_factory=dict)  # hashes -> µs a page

    @property
    def long(self) -> list[int]:
        return [i for i, s in enumerate(self.status) if s == "long"]


def prepare_walk(c: Corpus, hash_counts: Sequence[int]) -> Prepared:
    analyses = c.analyses[False]
    n = len(analyses)
    status, raw, canon, tl, fk = [], [], [], [], []
    for a in analyses:
        raw.append(a.raw_fp)
        canon.append(a.canonical_fp if a.canonical_fp is not None else -1)
        tl.append(a.text_length)
        if a.error is not None:
            status.append(SKIP)
            fk.append([])
        elif a.sketch is None:
            status.append("short")
            fk.append([])
        else:
            status.append("long")
            assert a.features is not None
            fk.append([int(f) & KEY_MASK for f in a.features.tolist()])
    p = Prepared(c, status, raw, canon, tl, fk, {}, {})
    longs = p.long
    for h in sorted(set(hash_counts) - {0} | {84}):
        sk = Sketcher(Params(groups=h // 16 if h > 84 else 6, group_size=16 if h > 84 else 14))
        arr = np.zeros((n, h), dtype=np.uint32)
        t0 = time.perf_counter()
        for i in longs:
            sh = c.shingles[i]
            assert sh is not None
            arr[i] = sk.sketch(sh)
        p.sketch_us[h] = (time.perf_counter() - t0) / max(1, len(longs)) * 1e6
        p.sketches[h] = arr
    for i in longs:  # the engine's sketch is the 84-prefix of every longer one
        sketch = analyses[i].sketch
        assert sketch is not None
        if not all(np.array_equal(p.sketches[h][i, :84], sketch) for h in p.sketches):
            raise SystemExit(f"{c.name}: page {i}: sketch prefix differs from the engine's")
    c32 = [analyses[i].ld_signature for i in range(n)]
    p.ld = {
        "c32": c32,
        "c64": [ldsig.signature(t, 64, SETTINGS.ld_n) if t is not None else b""
                for t in c.text],
        "nib4": [bytes(x & 0x0F for x in s) for s in c32],
    }
    return p


def band_keys(sketch84: np.ndarray, b: int, r: int) -> np.ndarray:
    """(pages, b) u32 keys: band j = mix64 chain over min-hashes j*r..j*r+r-1, seeded by j."""
    vals = sketch84[:, : b * r].reshape(-1, b, r).astype(np.uint64)
    h = mix64(np.arange(1, b + 1, dtype=np.uint64) * golden() + U64(0xBA4D))
    h = np.broadcast_to(h, vals.shape[:2]).copy()
    for j in range(r):
        h = mix64(h ^ vals[:, :, j])
    return (h & U64(KEY_MASK)).astype(np.int64)


# --- the walk ---------------------------------------------------------------------------------


@dataclass
class Walked:
    outcomes: list[Outcome]
    tier_pages: int = 0  # pages that reached the near-verified tier
    candidates: int = 0  # pages the lookup returned for them
    verified: int = 0  # verifications run (at most MAX_CANDIDATES a page)
    seconds: float = 0.0  # candidate lookup + verification, long pages
    reads: int = 0  # exact records read from disk (both tiers)


class Walker:
    def __init__(self, p: Prepared, v: Variant) -> None:
        self.p, self.v = p, v
        ver = v.verifier
        self.reads = 0  # exact records read (both tiers)
        self.floor = theory_floor(ver.hashes, ver.bits) if ver.exact and ver.hashes else 0.0
        if ver.hashes:
            mask = np.uint32(KEY_MASK if ver.bits >= 32 else (1 << ver.bits) - 1)
            sk = p.sketches[ver.hashes] & mask
            self.record = sk.astype(np.uint8 if ver.bits <= 8 else np.uint32)
        self.bands = ([] if v.bands is None else
                      band_keys(p.sketches[84], *v.bands).tolist())
        self.sets = [None if sh is None or not ver.exact else sh[sh % U64(ver.sample) == 0]
                     for sh in p.c.shingles]
        self.ld = None if ver.ld == "off" else p.ld[ver.ld]
        self.ld_c = p.ld_c.get(ver.ld, 32)

    def passes(self, i: int, k: int, bar: float) -> bool:
        ver = self.v.verifier
        if ver.hashes:
            m = int(np.count_nonzero(self.record[i] == self.record[k]))
            if bbit_estimate(m, ver.hashes, ver.bits) < (self.floor if ver.exact else bar):
                return False
        if ver.exact:
            self.reads += 1
            a, b = self.sets[i], self.sets[k]
            assert a is not None and b is not None
            inter = np.intersect1d(a, b, assume_unique=True).shape[0]
            union = a.shape[0] + b.shape[0] - inter
            if union == 0 or inter / union < bar:
                return False
        if self.ld is None:
            return True
        limit = LD_RATIO * max(self.p.text_length[i], self.p.text_length[k])
        return ldsig.estimate(self.ld[i], self.ld[k], self.ld_c, limit) <= limit

    def walk(self) -> Walked:
        p = self.p
        raw_first: dict[int, int] = {}
        canon_first: dict[int, int] = {}
        postings: dict[int, list[int]] = {}  # feature key -> kept pages, oldest first
        band_post: dict[tuple[int, int], list[int]] = {}
        out: list[Outcome] = []
        w = Walked(out)
        self.reads = 0
        for i, status in enumerate(p.status):
            if status == SKIP:
                out.append(Outcome(SKIP))
                continue
            first = raw_first.get(p.raw_fp[i])  # exact, then canonical (pages with text)
            if first is None and p.text_length[i] > 0:
                first = canon_first.get(p.canonical_fp[i])
            if first is None and status == "long":
                t0 = time.perf_counter()
                first = self._near(i, postings, band_post, w)
                w.seconds += time.perf_counter() - t0
            if first is not None:
                out.append(Outcome(DROP, first))
                continue
            out.append(Outcome(KEEP))
            raw_first.setdefault(p.raw_fp[i], i)
            if p.text_length[i] > 0:
                canon_first.setdefault(p.canonical_fp[i], i)
            for key in p.feature_keys[i]:
                postings.setdefault(key, []).append(i)
            for j, key in enumerate(self.bands[i] if self.bands else ()):
                band_post.setdefault((j, key), []).append(i)
        w.reads = self.reads
        return w

    def _near(self, i: int, postings: dict[int, list[int]],
              band_post: dict[tuple[int, int], list[int]], w: Walked) -> int | None:
        """The kept page a long page is a near-duplicate of (near or near-verified), if any."""
        shared: Counter[int] = Counter()
        for key in self.p.feature_keys[i]:
            shared.update(postings.get(key, ())[-CAP:])
        found = sorted((k for k, n in shared.items() if n >= SETTINGS.threshold),
                       key=lambda k: (-shared[k], k))
        if found:
            for k in found[:MAX_CANDIDATES]:
                if self.passes(i, k, NEAR_BAR):
                    return k  # near
            return None  # verified-distinct
        if self.bands:
            for j, key in enumerate(self.bands[i]):
                shared.update(band_post.get((j, key), ())[-CAP:])
        weak = sorted(shared, key=lambda k: (-shared[k], k))
        if weak:
            w.tier_pages += 1
            w.candidates += len(weak)
        for k in weak[:MAX_CANDIDATES]:
            w.verified += 1
            if self.passes(i, k, self.v.bar):
                return k  # near-verified
        return None


# --- the estimator against exact J ------------------------------------------------------------


VERIFIERS = ((84, 32), (84, 8), (84, 4), (84, 2), (84, 1), (256, 1), (256, 2), (256, 4),
             (512, 1), (512, 2))


def estimator_table(p: Prepared, j8: np.ndarray, synthetic: int, seed: int = 5) -> str:
    """Per verifier: bytes, bar, sd at J 0.8 (theory), sd of (estimate - J) on synthetic text
    pairs and on the httpbis pairs with J8 in [0.7, 1), and P(accept) by J bucket."""
    rng = np.random.default_rng(seed)
    texts = TextPairs(rng)
    top = max(h for h, _ in VERIFIERS)
    big = Sketcher(Params(groups=top // 16, group_size=16))
    syn_j, syn_sk = [], []
    while len(syn_j) < synthetic:
        a, b, j = texts.pair(big, rng.uniform(0.65, 1.0))
        if 0.65 <= j < 1.0:
            syn_j.append(j)
            syn_sk.append((big.sketch(a), big.sketch(b)))
    sj = np.array(syn_j)
    longs = p.long
    pairs = [(i, k) for x, i in enumerate(longs) for k in longs[:x] if 0.7 <= j8[i, k] < 1.0]
    real_j = np.array([j8[i, k] for i, k in pairs])
    edges = ((0.65, 0.7), (0.7, 0.75), (0.75, 0.8), (0.8, 0.85), (0.85, 0.9), (0.9, 1.0))
    rows = []
    for hashes, bits in VERIFIERS:
        mask = np.uint32(KEY_MASK if bits >= 32 else (1 << bits) - 1)
        bar = theory_bar(hashes, bits)

        def est(x: np.ndarray, y: np.ndarray, h: int = hashes, m: np.uint32 = mask,
                b: int = bits) -> float:
            return bbit_estimate(int(np.count_nonzero((x[:h] & m) == (y[:h] & m))), h, b)

        se = np.array([est(x, y) for x, y in syn_sk])
        sk = p.sketches[hashes]
        re = np.array([est(sk[i], sk[k]) for i, k in pairs])
        accept = []
        for lo, hi in edges:
            sel = (sj >= lo) & (sj < hi)
            accept.append(f"{(se[sel] >= bar).mean():.3f} ({int(sel.sum())})")
        rows.append([f"{hashes} x {bits} bit", hashes * bits / 8, f"{bar:.3f}",
                     f"{theory_bar(hashes, bits, 0.78):.3f}",
                     bbit_sd(0.8, hashes, bits), float(np.std(se - sj)),
                     float(np.mean(se - sj)), float(np.std(re - real_j)),
                     float(np.mean(re - real_j)), *accept])
    heads = ["verifier (H x b)", "bytes", "bar (theory)", "bar@0.78", "sd at J 0.8 (theory)",
             "sd synthetic", "bias synthetic", f"sd {p.c.name} ({len(pairs)} pairs)",
             f"bias {p.c.name}"] + [f"P(accept) J {lo}–{hi}" for lo, hi in edges]
    return (table(heads, rows) + f"\n\nSynthetic: {len(sj)} TextPairs (accuracy.py: Zipf "
            "tokens, random substitutions) with exact J in [0.65, 1); the accept columns are "
            "on those, (n) pairs per bucket.\n")


# --- URLs -------------------------------------------------------------------------------------


URL_DICT = 8192  # preset dictionary bytes (32 KiB: 1 B smaller a URL, 2.7x the µs)


def url_bytes(c: Corpus) -> tuple[float, float, float, float, float]:
    """Mean bytes a URL of the second half of the stream: raw, zlib per URL without and with a
    preset dictionary (the first half's URLs, last URL_DICT bytes), front coding against the
    previous URL (one length byte + the differing suffix); and µs to compress one with the
    dictionary."""
    urls = [p.url.encode() for p in c.pages]
    half = len(urls) // 2
    zdict = b"".join(urls[:half])[-URL_DICT:]
    test = urls[half:]

    def deflate(u: bytes, zd: bytes | None) -> int:
        z = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY,
                             **({"zdict": zd} if zd else {}))
        return len(z.compress(u) + z.flush())

    front = [1 + len(u) - _common(u, prev) for prev, u in zip(test, test[1:], strict=False)]
    t0 = time.perf_counter()
    with_dict = [deflate(u, zdict) for u in test]
    us = (time.perf_counter() - t0) / max(1, len(test)) * 1e6
    return (float(np.mean([len(u) for u in test])),
            float(np.mean([deflate(u, None) for u in test])),
            float(np.mean(with_dict)), float(np.mean(front)), us)


def url_table(corpora: Sequence[Corpus]) -> str:
    rows = []
    for c in corpora:
        raw, plain, zd, front, us = url_bytes(c)
        rows.append([c.name, len(c.pages) - len(c.pages) // 2, raw, plain, zd, us, front])
    return table(["corpus", "URLs measured", "raw B", "zlib, no dict B",
                  f"zlib + {URL_DICT} B preset dict B", "µs to compress one", "front coding vs "
                  "previous B"], rows)


def shingle_record_bytes(p: Prepared, sample: int = 1) -> tuple[float, float]:
    """Mean bytes of a long page's exact record on disk: its shingle set (or its MOD_sample
    part) as sorted 32-bit fingerprints (their top halves), raw and delta + varint coded."""
    raw, coded = [], []
    for i in p.long:
        sh = p.c.shingles[i]
        assert sh is not None
        top = np.unique(sh[sh % U64(sample) == 0] >> U64(32))
        gaps = np.diff(top, prepend=U64(0))
        raw.append(4 * top.shape[0])
        coded.append(int(sum(int((gaps >= U64(1 << (7 * k))).sum()) for k in range(5))))
    return float(np.mean(raw)), float(np.mean(coded))


def budget_table(p: Prepared) -> str:
    """RAM (and disk) a kept page costs, by part, for today and the candidate designs, with
    this corpus' URLs, LD signatures and shingle sets. Features and exact layers: the memory
    index's 8 B a key. Fixed row: 45 B today; 24 B with 32-bit halves of the raw and canonical
    fingerprints (the exact layers' keys are the other halves), a 64-bit page id, the URL's
    32-bit arena end, a 32-bit text length and flags; +8 B for a disk record's offset; -4 B
    when the URL is in that record."""
    raw, _, zd, _, _ = url_bytes(p.c)
    ld = float(np.mean([len(p.ld["c32"][i]) for i in p.long]))
    _, disk = shingle_record_bytes(p)
    _, half = shingle_record_bytes(p, 2)
    designs = [  # name, row, bands, RAM record, LD, URL in RAM, on disk
        ("today", 45, 0, 336, ld, raw, 0.0),
        ("RAM only: bands 5x4 + 256x2b (bar 0.849), URL zlib", 24, 40, 64, 0, zd, 0.0),
        ("hybrid: bands 5x4 + exact J on disk, URL raw", 32, 40, 0, 0, raw, disk),
        ("hybrid, URL zlib", 32, 40, 0, 0, zd, disk),
        ("hybrid, URL on disk", 28, 40, 0, 0, 0, disk + raw),
        ("hybrid, bands 8x5, URL zlib", 32, 64, 0, 0, zd, disk),
        ("hybrid, URL zlib, record on 1/2 of shingles", 32, 40, 0, 0, zd, half),
    ]
    rows = [[name, 48, 16, row, bands, record, ld, url,
             48 + 16 + row + bands + record + ld + url, on_disk]
            for name, row, bands, record, ld, url, on_disk in designs]
    return table(["design", "features", "exact layers", "fixed row", "bands", "RAM record",
                  "LD", "URL", "RAM B/page", "disk B/page (delta-varint shingles)"], rows)


def _common(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b), 255)
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# --- tables -----------------------------------------------------------------------------------


def engine_agreement(c: Corpus, today: list[Outcome]) -> str:
    engine = ours(SETTINGS)(c)
    diff = [i for i, (x, y) in enumerate(zip(engine, today, strict=True)) if x != y]
    return (f"today's walk vs the engine (Deduplicator(Settings()).check per page): "
            f"{len(engine) - len(diff)} / {len(engine)} pages with the same decision and named "
            f"page" + (f"; differ at {diff[:20]}" if diff else ""))


def tradeoff_rows(p: Prepared, j8: np.ndarray, vs: Sequence[Variant],
                  analysis_us: float, repeat: int = 3
                  ) -> tuple[list[list[object]], dict[str, tuple[float, float, float]], str]:
    ld_bytes = {k: float(np.mean([len(v[i]) for i in p.long])) for k, v in p.ld.items()}
    ld_bytes["nib4"] /= 2
    ld_bytes["off"] = 0.0
    today_record = Verifier().ram_bytes() + ld_bytes["c32"]
    rows, points = [], {}
    for v in vs:
        walker = Walker(p, v)
        w = walker.walk()
        w.seconds = min(w.seconds, *(walker.walk().seconds for _ in range(repeat - 1)))
        s = kept_relative(w.outcomes, j8)
        ver = v.verifier
        ram = v.index_bytes() + ver.ram_bytes() + ld_bytes[ver.ld]
        added = ram - today_record
        longs = max(1, len(p.long))
        extra_sketch = p.sketch_us[ver.hashes] - p.sketch_us[84] if ver.hashes > 84 else 0.0
        rows.append([
            v.name, f"{v.bar:.3f}", f"{s.precision:.3f} ({s.drops - s.drops_no_j8})",
            s.drops_below_05,
            *(f"{r:.3f} ({h}/{n})" if n else "– (0)"
              for r, h, n in zip(s.recall, s.bucket_dropped, s.bucket_pages, strict=True)),
            ram, f"{added:+.0f}", w.candidates / max(1, w.tier_pages), w.verified / longs,
            w.reads / longs if ver.exact else "–",
            w.seconds / longs * 1e6, extra_sketch,
        ])
        points[v.name] = (ram, s.recall[0], s.precision)
    disk_raw, disk_coded = shingle_record_bytes(p)
    note = (f"\n\nBytes: today's record is 84 x 4 = 336 B of sketch + {ld_bytes['c32']:.0f} B of "
            f"LD signature (mean of the long pages; c=64: {ld_bytes['c64']:.0f}, 4-bit: "
            f"{ld_bytes['nib4']:.0f}); a band adds 8 B; exact J reads the kept page's shingle set "
            f"from disk (0 B of RAM; on disk {disk_raw:.0f} B a long page as sorted 32-bit "
            f"fingerprints, {disk_coded:.0f} B delta + varint coded). Candidates: mean pages "
            f"returned per page reaching the near-verified tier; verified: per long page. The "
            f"engine's whole analysis is {analysis_us:.0f} µs a long page here (canonical + "
            f"sketch stages).\n")
    return rows, points, note


HEADS = ["variant", "bar", "precision (drops)", "drops J8 < 0.5", "recall J8 0.8–0.9", "0.9–0.95",
         "0.95–1", "RAM B/page (bands + record + LD)", "vs today", "candidates / tier page",
         "verified / long page", "disk reads / long page", "µs/page lookup+verify (prototype)",
         "µs/page extra sketch"]


def plot(points: dict[str, tuple[float, float, float]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 7))
    for n, (name, (ram, recall, precision)) in enumerate(points.items()):
        color = "tab:green" if precision >= 0.99 else "tab:red"
        ax.scatter(ram, recall, color=color, s=60 if name == "today" else 18,
                   marker="*" if name == "today" else "o")
        ax.annotate(name, (ram, recall), fontsize=5, xytext=(4, 6 * (n % 3) - 6),
                    textcoords="offset points")
    ax.axhline(0.9, color="grey", lw=0.6, ls="--")
    ax.set_xscale("symlog", linthresh=16)
    ax.set_xlim(-2, 4000)
    ax.set_xlabel("RAM bytes a page: extra band keys + verification record + LD signature "
                  "(httpbis' LD: 2 KB; exact J reads its record from disk)")
    ax.set_ylabel("recall, J8 0.8–0.9 (httpbis, kept-relative)")
    ax.set_title("near-verified tier: recall vs bytes (green: precision ≥ 0.99, red: below)")
    fig.tight_layout()
    fig.savefig(png, dpi=130)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=("httpbis", "warc", "both"), default="both")
    ap.add_argument("--synthetic-pairs", type=int, default=1500)
    ap.add_argument("--png", type=Path, default=PNG)
    args = ap.parse_args(argv)
    print(benchlib.header("# bench/recall_walk.py"))
    names = ("httpbis", "warc") if args.corpus == "both" else (args.corpus,)
    vs = variants()
    counts = {v.verifier.hashes for v in vs} | {h for h, _ in VERIFIERS}
    corpora, prepared = [], []
    for name in names:
        t0 = time.perf_counter()
        c = load(name)
        corpora.append(c)
        p = prepare_walk(c, sorted(counts))
        prepared.append(p)
        j8 = j8_matrix(c)
        a = [c.analyses[False][i] for i in p.long]
        analysis_us = float(np.mean([x.canonical_s + x.sketch_s for x in a])) * 1e6
        print(f"## {name} ({len(c.pages)} pages, {len(p.long)} long; prepared in "
              f"{time.perf_counter() - t0:.1f} s)\n")
        today = Walker(p, TODAY).walk()
        print(engine_agreement(c, today.outcomes) + "\n")
        print("sketch µs a long page by min-hashes: "
              + ", ".join(f"{h}: {us:.1f}" for h, us in sorted(p.sketch_us.items())) + "\n")
        rows, points, note = tradeoff_rows(p, j8, vs, analysis_us)
        print(table(HEADS, rows) + note)
        if name == "httpbis":
            print("### The estimators against exact J\n")
            print(estimator_table(p, j8, args.synthetic_pairs))
            plot(points, args.png)
            print(f"(plot: {args.png.name})\n")
    print("## URL bytes\n")
    print(url_table(corpora))
    for p in prepared:
        print(f"\n## RAM a kept page costs ({p.c.name}'s URLs, LD signatures, shingle sets)\n")
        print(budget_table(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
