#!/usr/bin/env python3
"""How often stream-dedup is wrong: the filter curve, real-page precision/recall, LD estimates.

A script that prints tables (Markdown), not a test. Sections:

curve   P(drop | resemblance) measured on synthetic pairs against Broder's P_{k,s,r}(ρ)
        (stream_dedup.core.theory.acceptance), per bucket of ρ from 0.5 to 1.0, plotted to
        bench/curve.png. Two kinds of pairs:
        - sets: two sets of n random 64-bit shingle fingerprints sharing exactly m, so
          J = m / (2n − m) is known exactly; fed to Sketcher.sketch/features directly,
          under every min-hash family (the default first);
        - texts: token-hash sequences (Zipf vocabulary) and a copy with random token
          substitutions, shingled by Sketcher.shingles (the engine's own shingle hashing),
          J computed exactly on the two shingle sets; the default family.
        A pair is "dropped" when it shares ≥ r = 2 of the k = 6 features (what the index's
        candidates() asks for).
real    Replays (Deduplicator.decide over each page's analysis, in order) of the httpbis drafts
        in revision order and of the WARC set in tests/test_corpus.py's order, in several modes:
        defaults, boilerplate=True, threshold=1 (r = 1: "verify pages sharing one feature"),
        each with verification on (verify_rate=1) and off (verify_rate=0). Ground truth is
        J8, the exact Jaccard of word 8-shingle sets, computed here from OUR canonical text
        (canonicalize + Sketcher.shingles, default mode) and also taken from the provided CSVs.
        Precision = share of drops whose page and the page it was called a duplicate of have
        J8 ≥ 0.8. Recall per J8 bucket = share of ground-truth pairs whose later page was
        dropped, over all pairs and over pairs whose earlier page was kept (only kept pages
        are indexed, so a pair whose earlier page was dropped can only be caught through
        another page).
ld      Coates' estimated Levenshtein distance against the true distance (rapidfuzz, on our
        canonical text; and the provided lev_distance) for the httpbis pairs, for several
        compression factors c and window lengths n: median and p90 of |est − true| / max(len).

    python bench/accuracy.py                  # everything (~3-5 min)
    python bench/accuracy.py --quick          # fewer pairs (~1-2 min); plot in $TMPDIR
    python bench/accuracy.py --sections curve --pairs-per-bucket 2000
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np
import xxhash
from rapidfuzz.distance import Levenshtein

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from benchlib import table  # noqa: E402

from stream_dedup import Settings  # noqa: E402
from stream_dedup.core import ldsig, theory  # noqa: E402
from stream_dedup.core.sketch import FAMILIES, Params, Sketcher  # noqa: E402
from stream_dedup.models import Decision, Page  # noqa: E402
from stream_dedup.pipeline.deduplicator import Analysis, Analyzer, Deduplicator  # noqa: E402

SECTIONS = ("curve", "real", "ld")
K, S, R = 6, 14, 2
NAN = float("nan")

# --- (a) the filter curve -------------------------------------------------------------------


def _shared_features(sk: Sketcher, a: np.ndarray, b: np.ndarray) -> tuple[int, float]:
    sa, sb = sk.sketch(a), sk.sketch(b)
    shared = int(np.count_nonzero(sk.features(sa) == sk.features(sb)))
    return shared, float(np.count_nonzero(sa == sb)) / sa.shape[0]


def set_pairs(
    rng: np.random.Generator, lo: float, hi: float, count: int
) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """Pairs of random fingerprint sets with an exactly known Jaccard in [lo, hi)."""
    out = []
    for _ in range(count):
        n = int(rng.integers(300, 1500))
        target = rng.uniform(lo, hi)
        m = min(n, round(2 * n * target / (1 + target)))
        pool = rng.integers(0, 2**64 - 1, size=2 * n - m, dtype=np.uint64, endpoint=True)
        a = pool[:n]
        b = np.concatenate((pool[:m], pool[n:]))
        out.append((a, b, m / (2 * n - m)))
    return out


class TextPairs:
    """Token-hash sequences and edited copies, shingled by the engine's Sketcher.shingles."""

    def __init__(self, rng: np.random.Generator, vocab: int = 5000) -> None:
        self.rng = rng
        self.tokens = rng.integers(0, 2**64 - 1, size=vocab, dtype=np.uint64, endpoint=True)
        p = 1.0 / np.arange(1, vocab + 1) ** 1.05
        self.p = p / p.sum()

    def pair(self, sk: Sketcher, target: float) -> tuple[np.ndarray, np.ndarray, float]:
        rng = self.rng
        length = int(rng.integers(300, 1500))
        a = rng.choice(self.tokens, size=length, p=self.p)
        b = a.copy()
        w = sk.params.shingle_words
        edits = int(round(length * (1 - target) / (w * (1 + target))))
        if edits:
            where = rng.choice(length, size=min(edits, length), replace=False)
            b[where] = rng.choice(self.tokens, size=where.shape[0], p=self.p)
        sa, sb = np.unique(sk.shingles(a)), np.unique(sk.shingles(b))
        inter = np.intersect1d(sa, sb, assume_unique=True).shape[0]
        return sa, sb, inter / (sa.shape[0] + sb.shape[0] - inter)


@dataclass
class Bucket:
    lo: float
    hi: float
    j: list[float]
    drop: list[bool]
    res_err: list[float]

    def add(self, j: float, dropped: bool, res: float) -> None:
        self.j.append(j)
        self.drop.append(dropped)
        self.res_err.append(res - j)

    def stats(self) -> tuple[int, float, float, float, float]:
        """pairs, mean ρ, mean P(ρ_i), measured share, two-sided p-value of the count."""
        n = len(self.j)
        if n == 0:
            return 0, NAN, NAN, NAN, NAN
        p = np.array([theory.acceptance(x, K, S, R) for x in self.j])
        return (n, float(np.mean(self.j)), float(p.mean()), float(np.mean(self.drop)),
                poisson_binomial_p(p, int(np.sum(self.drop))))


def poisson_binomial_p(p: np.ndarray, observed: int) -> float:
    """Two-sided p-value of `observed` successes among independent trials with success
    probabilities p: total probability of the counts no more likely than the observed one."""
    pmf = np.zeros(p.shape[0] + 1)
    pmf[0] = 1.0
    for i, q in enumerate(p, start=1):
        pmf[1 : i + 1] = pmf[1 : i + 1] * (1 - q) + pmf[:i] * q
        pmf[0] *= 1 - q
    return float(min(1.0, pmf[pmf <= pmf[observed] * (1 + 1e-9)].sum()))


def filter_curve(per_bucket: int, png: Path, seed: int = 1) -> str:
    edges = [0.5 + 0.025 * i for i in range(21)]
    rng = np.random.default_rng(seed)
    default = Params().family
    set_sketchers = {f"sets, {f}": Sketcher(Params(family=f))
                     for f in (default, *(f for f in FAMILIES if f != default))}
    text_kind = f"texts, {default}"
    sketcher = set_sketchers[f"sets, {default}"]
    kinds = (*set_sketchers, text_kind)
    buckets: dict[str, list[Bucket]] = {
        k: [Bucket(lo, hi, [], [], []) for lo, hi in zip(edges, edges[1:], strict=False)]
        for k in kinds
    }
    texts = TextPairs(rng)
    t0 = time.perf_counter()
    for bi, (lo, hi) in enumerate(zip(edges, edges[1:], strict=False)):
        for a, b, j in set_pairs(rng, lo, hi, per_bucket):
            for name, sk in set_sketchers.items():
                shared, res = _shared_features(sk, a, b)
                buckets[name][bi].add(j, shared >= R, res)
        for _ in range(per_bucket):
            a, b, j = texts.pair(sketcher, rng.uniform(lo, hi))
            shared, res = _shared_features(sketcher, a, b)
            # bucket by the exact J (edits hit the target only roughly)
            idx = min(int((j - 0.5) / 0.025), len(edges) - 2)
            if idx >= 0:
                buckets[text_kind][idx].add(j, shared >= R, res)
    elapsed = time.perf_counter() - t0

    rows = []
    worst: dict[str, float] = {}
    total_pairs: Counter[str] = Counter()
    for bi in range(len(edges) - 1):
        row: list[object] = [f"{edges[bi]:.3f}–{edges[bi + 1]:.3f}"]
        for name in kinds:
            n, mean_j, p_theory, measured, pval = buckets[name][bi].stats()
            total_pairs[name] += n
            if name == kinds[0]:
                row += [n, mean_j, p_theory]
            cells = [measured, _pval(pval)]
            row += cells if name != text_kind else [n, p_theory, *cells]
            if n:
                worst[name] = min(worst.get(name, 1.0), pval)
        rows.append(row)
    heads = ["ρ bucket", "pairs", "mean ρ", "P_{6,14,2} (theory)"]
    for name in set_sketchers:
        heads += [name.replace(",", ""), "p"]
    heads += ["text pairs", "P (theory)", text_kind.replace(",", ""), "p"]
    bias_rows = []
    for name in kinds:
        errs = np.concatenate([np.array(b.res_err) for b in buckets[name] if b.res_err])
        js = np.concatenate([np.array(b.j) for b in buckets[name] if b.j])
        se = np.sqrt(js * (1 - js) / (K * S))
        bias_rows.append([name, total_pairs[name], float(errs.mean()), float(errs.std()),
                          float(se.mean()), worst.get(name, NAN)])
    _plot(buckets, png)
    text = table(heads, rows) + "\n\n"
    tests = sum(1 for name in kinds for b in buckets[name] if b.j)
    text += (
        "p = two-sided p-value of the bucket's drop count under the theory (exact "
        "Poisson-binomial over the pairs' own P(ρ_i)). With "
        f"{tests} buckets tested, p < {0.05 / tests:.4f} (Bonferroni, 5 %) would be a real "
        "disagreement with P_{6,14,2}.\n\nFull-sketch resemblance estimate (84 min-hashes) "
        "against the exact ρ of the same pairs:\n\n"
    )
    text += table(["pairs", "n", "mean (est − ρ)", "sd (est − ρ)", "theory sd √(ρ(1−ρ)/84)",
                   "smallest p of the curve"], bias_rows)
    text += f"\n\n{sum(total_pairs.values()):,} pairs in {elapsed:.0f} s; plot: {png.name}\n"
    return text


def _pval(p: float) -> str:
    return "–" if p != p else ("<0.001" if p < 0.001 else f"{p:.3f}")


def _plot(buckets: dict[str, list[Bucket]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = np.linspace(0.5, 1.0, 201)
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    ax.plot(xs, [theory.acceptance(float(x), K, S, R) for x in xs], color="black",
            label=f"theory: P(≥ {R} of {K} features shared)")
    for (name, bl), marker in zip(buckets.items(), "osD^", strict=False):
        pts = [(np.mean(b.j), np.mean(b.drop), len(b.j)) for b in bl if b.j]
        x = np.array([p[0] for p in pts])
        y = np.array([p[1] for p in pts])
        err = np.sqrt(y * (1 - y) / np.array([p[2] for p in pts]))
        ax.errorbar(x, y, yerr=2 * err, fmt=marker, ms=4, capsize=2, alpha=0.8,
                    label=f"measured: {name} (±2 s.e.)")
    half = theory.half_point(K, S, R)
    ax.axvline(half, color="grey", ls=":", lw=1, label=f"50 % at ρ = {half:.3f}")
    ax.set_xlabel("resemblance ρ (exact Jaccard of the shingle sets)")
    ax.set_ylabel("P(drop) = P(≥ 2 of 6 features shared)")
    ax.set_title(f"measured vs theory: {theory.curve_title(K, S, R)}")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


# --- (b) real pages ---------------------------------------------------------------------------


@dataclass
class Corpus:
    name: str
    pages: list[Page]
    shingles: list[np.ndarray | None]  # sorted unique shingle fingerprints (our J8), None=reject
    text: list[np.ndarray | None]  # canonical code points
    analyses: dict[bool, list[Analysis]]  # by boilerplate


def prepare(name: str, pages: list[Page]) -> Corpus:
    sketcher = Sketcher(Params())
    analyses: dict[bool, list[Analysis]] = {}
    shingles: list[np.ndarray | None] = []
    texts: list[np.ndarray | None] = []
    for boilerplate in (False, True):
        analyzer = Analyzer(Settings(boilerplate=boilerplate))
        out = []
        for page in pages:
            a, tokens = analyzer.canonical(page)
            if tokens is not None:
                if not boilerplate:
                    shingles.append(np.unique(sketcher.shingles(tokens.hashes)))
                    texts.append(tokens.codepoints)
                a = analyzer.finish(a, tokens)
            elif not boilerplate:
                shingles.append(None)
                texts.append(None)
            out.append(a)
        analyses[boilerplate] = out
    return Corpus(name, pages, shingles, texts, analyses)


def jaccard(c: Corpus, i: int, j: int) -> float:
    a, b = c.shingles[i], c.shingles[j]
    if a is None or b is None:
        return NAN
    if a.shape[0] == 0 or b.shape[0] == 0:  # fewer than 8 tokens: compare the texts
        ta, tb = c.text[i], c.text[j]
        assert ta is not None and tb is not None
        if ta.shape[0] == 0 and tb.shape[0] == 0:
            return NAN  # no visible text at all: undefined
        return 1.0 if a.shape[0] == b.shape[0] == 0 and np.array_equal(ta, tb) else 0.0
    inter = np.intersect1d(a, b, assume_unique=True).shape[0]
    return inter / (a.shape[0] + b.shape[0] - inter)


MODES: dict[str, Settings] = {
    "default": Settings(),
    "default, no verify": Settings(verify_rate=0.0),
    "r=2 only": Settings(verify_single_feature=False),
    "r=2 only, no verify": Settings(verify_single_feature=False, verify_rate=0.0),
    "boilerplate": Settings(boilerplate=True),
    "boilerplate, no verify": Settings(boilerplate=True, verify_rate=0.0),
    "r=1": Settings(threshold=1),
    "r=1, no verify": Settings(threshold=1, verify_rate=0.0),
}
RECALL_MODES = ("default", "r=2 only", "r=2 only, no verify", "boilerplate", "r=1")


def run_modes(c: Corpus) -> dict[str, list[Decision]]:
    """Each mode's decisions: decide() over analyses computed once per boilerplate setting
    (what check_batch does); the default mode is checked against check() page by page."""
    out = {}
    for mode, settings in MODES.items():
        dd = Deduplicator(settings)
        out[mode] = [dd.decide(a) for a in c.analyses[settings.boilerplate]]
    dd = Deduplicator(MODES["default"])
    for page, d in zip(c.pages, out["default"], strict=True):
        if dd.check(page) != d:
            raise SystemExit(f"{c.name}: decide(analyze(page)) and check(page) disagree")
    return out


def kept_position(decisions: Sequence[Decision]) -> dict[int, int]:
    return {d.page_id: i for i, d in enumerate(decisions) if d.decision == "keep" and
            d.page_id is not None}


def precision_table(c: Corpus, runs: dict[str, list[Decision]]) -> str:
    rows = []
    edges = (0.0, 0.5, 0.8, 0.9, 1.0001)
    for mode, decisions in runs.items():
        where = kept_position(decisions)
        near_j, all_j = [], []
        for i, d in enumerate(decisions):
            if d.decision != "drop" or d.duplicate_of is None:
                continue
            j = jaccard(c, i, where[d.duplicate_of.page_id])
            all_j.append(j)
            if d.reason == "near":
                near_j.append(j)
        near = np.array(near_j)
        alls = np.array(all_j)
        undefined = int(np.isnan(alls).sum())  # both pages without visible text
        alls = alls[~np.isnan(alls)]
        hist = [int(((near >= lo) & (near < hi)).sum()) for lo, hi in zip(edges, edges[1:],
                                                                       strict=False)]
        reasons = Counter(f"{d.decision}/{d.reason}" for d in decisions)
        rows.append([
            mode, len(near), _share(near >= 0.8), len(alls) + undefined, undefined,
            _share(alls >= 0.8), *hist,
            reasons["keep/verified-distinct"], sum(d.verified for d in decisions),
        ])
    return table(
        ["mode", "near drops", "precision (J8 ≥ 0.8)", "all drops", "… no text",
         "precision, all drops with text",
         "near J8 <0.5", "0.5–0.8", "0.8–0.9", "≥ 0.9", "overturned (kept)", "confirmed"],
        rows,
    )


def _share(mask: np.ndarray) -> float:
    return float(mask.mean()) if mask.shape[0] else NAN


J_EDGES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0001)


def recall_table(
    c: Corpus, runs: dict[str, list[Decision]], pairs: Sequence[tuple[int, int, float]],
    use_ours: bool,
) -> str:
    """pairs: (earlier position, later position, provided J8). Per mode: share of pairs whose
    later page was dropped (for any reason: it may duplicate a third page); among pairs whose
    earlier page was kept, the share dropped, and the share dropped as a duplicate of that
    earlier page (the pair itself caught)."""
    rows = []
    for lo, hi in zip(J_EDGES, J_EDGES[1:], strict=False):
        sel = []
        for e, later, j_given in pairs:
            j = jaccard(c, e, later) if use_ours else j_given
            if lo <= j < hi:
                sel.append((e, later, j))
        if not sel:
            continue
        p = np.mean([theory.acceptance(min(1.0, j), K, S, R) for _, _, j in sel])
        row: list[object] = [f"{lo:.2f}–{min(hi, 1.0):.2f}", len(sel), float(p)]
        for mode in RECALL_MODES:
            d = runs[mode]
            where = kept_position(d)
            dropped = [d[later].decision == "drop" for _, later, _ in sel]
            kept = [(e, later) for e, later, _ in sel if d[e].decision == "keep"]
            caught = [
                d[later].decision == "drop" and d[later].duplicate_of is not None
                and where.get(d[later].duplicate_of.page_id) == e
                for e, later in kept
            ]
            row += [float(np.mean(dropped)),
                    _pct([d[later].decision == "drop" for _, later in kept]),
                    _pct(caught, with_n=False)]
        rows.append(row)
    heads = ["J8 bucket", "pairs", "P_{6,14,2}"]
    for mode in RECALL_MODES:
        heads += [f"{mode}: dropped", "earlier kept: dropped (n)", "dup of earlier"]
    return table(heads, rows)


def _pct(flags: Sequence[bool], with_n: bool = True) -> str:
    if not flags:
        return "– (0)" if with_n else "–"
    return f"{np.mean(flags):.2f} ({len(flags)})" if with_n else f"{np.mean(flags):.2f}"


def httpbis_pairs(order: dict[str, int]) -> list[tuple[int, int, float]]:
    with open(benchlib.HTTPBIS / "pairs_groundtruth.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = []
    for r in rows:
        a, b = order[r["a"]], order[r["b"]]
        out.append((min(a, b), max(a, b), float(r["jaccard_w8"])))
    return out


def warc_position_map(pages: Sequence[Page]) -> tuple[dict[str, int], str]:
    """Ground-truth payload name ('.__aut__example.arc.gz/00014.html') -> stream position of
    the first page with the same body bytes. html_index.tsv's `n` is not our record ordinal
    (it counts records another way), but the k-th HTML row of a file is our k-th page of
    that file (counts agree per file; sha1 checked)."""
    import hashlib

    rows: dict[str, list[dict[str, str]]] = defaultdict(list)
    with open(benchlib.WARCS / "html_index.tsv", newline="") as fh:
        for r in csv.DictReader(fh, delimiter="\t"):
            rows[r["file"]].append(r)
    ours: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(pages):
        assert p.source is not None
        ours[benchlib.warc_relative(p.source)[0]].append(i)
    first_by_body: dict[int, int] = {}
    for i, p in enumerate(pages):
        first_by_body.setdefault(xxhash.xxh3_64_intdigest(p.body), i)
    out: dict[str, int] = {}
    sha_ok = rank_ok = files_off = 0
    for file, rs in rows.items():
        rs.sort(key=lambda r: int(r["n"]))
        mine = ours.get(file, [])
        if len(mine) != len(rs):
            files_off += 1
            continue
        for r, i in zip(rs, mine, strict=True):
            rank_ok += 1
            sha_ok += hashlib.sha1(pages[i].body).hexdigest() == r["sha1_decoded"]
            name = file.replace("/", "__") + f"/{int(r['n']):05d}.html"
            out[name] = first_by_body[xxhash.xxh3_64_intdigest(pages[i].body)]
    note = (f"{rank_ok} of {sum(map(len, rows.values()))} html_index rows mapped by rank within "
            f"their file ({files_off} files with other counts skipped); {sha_ok} of those "
            "have our body's sha1 (the rest: a wayback file whose bodies differ by a byte)")
    return out, note


def warc_pairs(where: dict[str, int], path: Path) -> tuple[list[tuple[int, int, float]], int]:
    out, skipped = [], 0
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            if r["a"] not in where or r["b"] not in where:
                skipped += 1
                continue
            a, b = where[r["a"]], where[r["b"]]
            if a == b:
                skipped += 1
                continue
            out.append((min(a, b), max(a, b), float(r["jaccard_w8"])))
    return out, skipped


def same_uri_table(c: Corpus, runs: dict[str, list[Decision]], where: dict[str, int]) -> str:
    rows = []
    with open(benchlib.WARCS / "same_uri_pairs_groundtruth.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            a, b = where.get(r["a"]), where.get(r["b"])
            if a is None or b is None:
                rows.append([r["uri"][:48], float(r["jaccard_w8"]), "unmapped", "", "", ""])
                continue
            e, later = min(a, b), max(a, b)
            if e == later:
                rows.append([r["uri"][:48], float(r["jaccard_w8"]), 1.0, "same bytes", "", ""])
                continue
            cells = []
            for mode in ("default", "default, no verify", "boilerplate"):
                d = runs[mode][later]
                cells.append(f"{d.decision}/{d.reason}" + (" (short)" if d.short else ""))
            rows.append([r["uri"][:48], float(r["jaccard_w8"]), jaccard(c, e, later), *cells])
    return table(["uri", "J8 (given)", "J8 (ours)", "default", "no verify", "boilerplate"],
                 rows)


def corpus_tables(c: Corpus, runs: dict[str, list[Decision]],
                  pairs: Sequence[tuple[int, int, float]],
                  provided: str, ours: str) -> list[str]:
    """Decision counts, precision and recall (by provided and by our J8) for one corpus."""
    return [
        "Decisions by mode: " + "; ".join(
            f"{m}: " + ", ".join(f"{k} {v}" for k, v in sorted(
                Counter(f"{d.decision}/{d.reason}" for d in ds).items()))
            for m, ds in runs.items() if m in ("default", "default, no verify")) + "\n",
        "Precision of the drops (J8 from our canonical text):\n",
        precision_table(c, runs) + "\n",
        f"Recall by J8 bucket, {provided}:\n",
        recall_table(c, runs, pairs, use_ours=False) + "\n",
        f"Recall by J8 bucket, {ours}:\n",
        recall_table(c, runs, pairs, use_ours=True) + "\n",
    ]


def real_pages(quick: bool) -> str:
    out = []
    t0 = time.perf_counter()
    order = benchlib.httpbis_in_revision_order()
    httpbis = prepare("httpbis", benchlib.load_httpbis_pages())
    runs = run_modes(httpbis)
    pos = {rel: i for i, rel in enumerate(order)}
    pairs = httpbis_pairs(pos)
    out.append(f"### httpbis-drafts ({len(httpbis.pages)} pages in revision order, "
               f"{len(pairs)} ground-truth pairs)\n")
    out += corpus_tables(httpbis, runs, pairs, "J8 as provided (pairs_groundtruth.csv)",
                         "J8 from our canonical text")
    mismatch = [abs(jaccard(httpbis, e, later) - j) for e, later, j in pairs]
    out.append(f"Our J8 vs provided J8 on the same pairs: median |Δ| {np.median(mismatch):.3f}, "
               f"p90 {np.percentile(mismatch, 90):.3f}, max {max(mismatch):.3f}.\n")

    warc_pages, rejected = benchlib.load_warc_pages()
    warc = prepare("warc", warc_pages)
    wruns = run_modes(warc)
    where, note = warc_position_map(warc_pages)
    allpairs, skipped = warc_pairs(where, benchlib.WARCS / "allpairs_j8_ge0.3.csv")
    out.append(f"### WARC set ({len(warc_pages)} pages, {rejected} records rejected by the "
               f"reader; {len(allpairs)} allpairs_j8_ge0.3 pairs mapped, {skipped} skipped)\n")
    out.append(f"Mapping: {note}.\n")
    out += corpus_tables(warc, wruns, allpairs,
                         "J8 as provided (allpairs_j8_ge0.3.csv, J8 ≥ 0.3 only)",
                         "same pairs, J8 from our canonical text")
    out.append("Same URI captured twice (same_uri_pairs_groundtruth.csv), the later capture's "
               "decision:\n")
    out.append(same_uri_table(warc, wruns, where) + "\n")
    out.append(f"({time.perf_counter() - t0:.0f} s)\n")
    return "\n".join(out)


# --- (c) estimated Levenshtein distance -----------------------------------------------------

LD_PARAMS = tuple(product((16, 32, 64, 100), (4, 8)))


def ld_errors(quick: bool) -> str:
    t0 = time.perf_counter()
    with open(benchlib.HTTPBIS / "pairs_groundtruth.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    if quick:
        rows = rows[::4]
    analyzer = Analyzer(Settings())
    texts: dict[str, np.ndarray] = {}

    def codepoints(rel: str) -> np.ndarray:
        if rel not in texts:
            page = Page(url=rel, body=(benchlib.HTTPBIS / rel).read_bytes(), headers=benchlib.HTML)
            _, tokens = analyzer.canonical(page)
            assert tokens is not None
            texts[rel] = tokens.codepoints
        return texts[rel]

    sigs: dict[tuple[str, int, int], bytes] = {}

    def sig(rel: str, c: int, n: int) -> bytes:
        key = (rel, c, n)
        if key not in sigs:
            sigs[key] = ldsig.signature(codepoints(rel), c, n)
        return sigs[key]

    true, given, longest = [], [], []
    est: dict[tuple[int, int], list[int]] = defaultdict(list)
    est_us: dict[tuple[int, int], float] = defaultdict(float)
    for r in rows:
        a, b = codepoints(r["a"]), codepoints(r["b"])
        for c, n in LD_PARAMS:
            sa, sb = sig(r["a"], c, n), sig(r["b"], c, n)
            t = time.perf_counter()
            est[(c, n)].append(ldsig.estimate(sa, sb, c))
            est_us[(c, n)] += time.perf_counter() - t
        ta = a.tobytes().decode("utf-32-le")
        tb = b.tobytes().decode("utf-32-le")
        true.append(Levenshtein.distance(ta, tb, score_hint=est[(32, 4)][-1]))
        given.append(int(r["lev_distance"]))
        longest.append(max(len(ta), len(tb)))
    true_a, given_a, long_a = np.array(true), np.array(given), np.array(longest)
    table_rows = []
    for c, n in LD_PARAMS:
        e = np.array(est[(c, n)])
        err = np.abs(e - true_a) / long_a
        err_g = np.abs(e - given_a) / long_a
        agree = np.mean((e / long_a <= 0.2) == (true_a / long_a <= 0.2))
        sig_len = np.mean([len(sig(r["a"], c, n)) for r in rows])
        table_rows.append([
            c, n, float(np.median(err)), float(np.percentile(err, 90)),
            float(np.median((e - true_a) / long_a)), float(np.median(err_g)),
            float(np.percentile(err_g, 90)), float(agree), float(sig_len),
            est_us[(c, n)] / len(rows) * 1e6,
        ])
    text = table(
        ["c", "n", "median abs err / len", "p90", "median signed err / len",
         "median vs provided", "p90 vs provided", "same side of 0.2", "signature bytes",
         "µs / estimate"],
        table_rows,
    )
    ratio = true_a / long_a
    text += (
        f"\n\n{len(rows)} httpbis pairs (canonical texts {int(long_a.min()):,}–"
        f"{int(long_a.max()):,} characters; true LD / len: median {np.median(ratio):.3f}, "
        f"{np.mean(ratio <= 0.2):.0%} of pairs ≤ 0.2). Errors are normalized by the longer "
        "canonical text, for the provided lev_distance too (it was measured on a "
        "differently extracted text, so part of that error is the extraction's). 'same side "
        "of 0.2' = share of pairs where est/len ≤ 0.2 ⇔ true/len ≤ 0.2 (the default "
        f"verify_max_ld_ratio). ({time.perf_counter() - t0:.0f} s)\n"
    )
    return text


# --- main -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer pairs")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"subset of {SECTIONS}")
    ap.add_argument("--pairs-per-bucket", type=int, default=None,
                    help="synthetic pairs per ρ bucket and kind (default 600; quick 150)")
    ap.add_argument("--png", help="where the curve plot goes (default: bench/curve.png, the "
                    "tracked figure RESULTS.md shows; with --quick a file in the temporary "
                    "directory, so a quick run never replaces it)")
    args = ap.parse_args(argv)
    if args.png is None:
        args.png = (Path(tempfile.gettempdir()) / "stream-dedup-curve-quick.png" if args.quick
                    else Path(__file__).resolve().parent / "curve.png")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}")
    print(benchlib.header("# bench/accuracy.py"))
    if "curve" in sections:
        per = args.pairs_per_bucket or (150 if args.quick else 600)
        print(f"## Filter curve: P(drop | ρ), k={K}, s={S}, r={R}\n")
        print(filter_curve(per, Path(args.png)), flush=True)
    if "real" in sections:
        print("## Real pages\n")
        print(real_pages(args.quick), flush=True)
    if "ld" in sections:
        print("## Estimated vs true Levenshtein distance (httpbis pairs)\n")
        print(ld_errors(args.quick), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
