#!/usr/bin/env python3
"""Kept-relative accuracy (issue 16): stream-dedup against datasketch and rensa on real pages.

Every system sees the same pages in the same order (httpbis drafts in revision order; the
WARC set in tests/test_corpus.py's order) and says, per page, keep, drop (naming an earlier
page) or skip (a page it cannot judge). Ground truth is J8 = the exact Jaccard of word
8-shingle sets, computed once per corpus from OUR canonical text (bench/accuracy.py's
`prepare` and `jaccard`: canonicalize -> Sketcher.shingles -> sorted unique 64-bit shingle
fingerprints; a page with fewer than 8 tokens has an empty set and is compared by its text).

The metric (`kept_relative`), for one system's outcomes:

- precision = share of the drops whose J8 with the page they NAMED is >= 0.8 (drops whose J8
  is undefined, both pages without visible text, are counted apart, not in the share);
- drops J8 < 0.5 = count of drops whose J8 with the named page is < 0.5;
- recall per J8 bucket [0.8, 0.9), [0.9, 0.95), [0.95, 1]: the unit is a LATER PAGE, counted
  once. For each page p (not skipped) its best kept J8 is max J8(p, k) over the earlier
  pages k < p that THIS system kept (undefined J8s ignored); p belongs to the bucket of that
  maximum (a page whose best kept match is below 0.8 is in no bucket). Recall = share of a
  bucket's pages the system dropped (for whatever page it named: naming is precision's job).
  So "against the earlier pages each system kept": a page is a near-duplicate to be caught
  iff something the system itself kept resembles it, and a page with a 0.97 kept match and
  an 0.85 one is one easy 0.95-1 case, not also a hard 0.8-0.9 one. Pairs whose earlier page
  the system dropped do not count (it can only catch those through another kept page,
  which then counts on its own). Because each system keeps different pages, the bucket
  sizes (n) differ between rows.

Systems (each a callable: the prepared corpus -> one Outcome per page):

- stream-dedup: `Deduplicator(settings).check(page)` on every page (the real engine, whole
  pipeline: parse, canonicalize, shingle, sketch, decide) with default Settings (verify_rate
  = 1.0: every candidate verified), verify_rate = 0 (no verification), and
  verify_single_feature = False (only pages sharing r = 2 features are candidates). A drop
  names the kept page of its `duplicate_of.page_id`; a reject is a skip.
- peers, fed the SAME shingles: the sorted unique 64-bit shingle fingerprints above (what J8
  is computed on). datasketch 2.0 `MinHash(num_perm=84, scheme="affine64", hashfunc=int)`:
  the fingerprints are its 64-bit hash values as they are (update_batch), then
  `MinHashLSH(params=(6, 14))` (any one of 6 bands of 14 equal = candidate) or
  `MinHashLSH(threshold=0.8)` (its own (b, r) for 84 permutations); query, drop when a
  candidate came back, else insert. rensa 0.5 `RMinHash(num_perm, seed=42).update(tokens)`
  with each fingerprint as its 8 little-endian bytes (rensa hashes those bytes itself), then
  `RMinHashDeduplicator(0.8, num_perm, use_lsh=True, num_bands)`: LSH candidates whose
  estimated Jaccard is >= 0.8 are duplicates (`get_duplicates`); drop if any, else `add`.
  Both peers name the candidate with the highest estimated Jaccard (oldest on a tie): they
  return sets, so the choice is ours. A page with an empty shingle set (fewer than 8 tokens:
  nothing to hash) is kept by a peer without being indexed; a page our analyzer rejects is a
  skip for every system.

Runtime: stream-dedup's seconds include its whole analysis (parsing included); a peer's
include its min-hashing and LSH only (the shingles are given). No I/O is timed.

Reading the figures: exact verification computes the same J8 as the ground truth, from the
same shingles, so its precision near 1.00 is expected; what the rows test is recall. Stored
shingle sets are sampled past 8,192 shingles, which costs some recall at J8 0.8-0.9 against
whole sets. `contained` drops (revisions at c8 >= 0.9 of an earlier one) count for recall
but not in the J8 precision. A page under min_shingles (25) is judged by the exact layers
only, by design, so a near-duplicate that short is a miss.

    python bench/kept_relative.py                 # both corpora (~1-2 min)
    python bench/kept_relative.py --corpus warc
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from accuracy import Corpus, jaccard, prepare  # noqa: E402
from benchlib import table  # noqa: E402

from stream_dedup import Settings  # noqa: E402
from stream_dedup.pipeline.deduplicator import Deduplicator  # noqa: E402

KEEP, DROP, SKIP = "keep", "drop", "skip"
# A drop for containment (issue 27): a drop for recall, not a claim of resemblance, so not
# in the J8 precision (bench/containment.py measures it by containment)
CONTAINED = "contained"
BUCKETS = ((0.8, 0.9), (0.9, 0.95), (0.95, 1.0))
NAN = float("nan")


class Outcome(NamedTuple):
    decision: str  # KEEP, DROP, CONTAINED or SKIP
    named: int | None = None  # a drop's earlier page (stream position)


@dataclass
class Scores:
    kept: int
    drops: int
    drops_no_j8: int  # drops whose J8 with the named page is undefined
    precision: float  # share of drops (with a J8) whose named page has J8 >= 0.8
    drops_below_05: int
    recall: list[float]  # per bucket (NaN: empty bucket)
    bucket_pages: list[int]  # per bucket: later pages whose best kept J8 is in it
    bucket_dropped: list[int]
    contained: int = 0  # drops for containment (in `drops`, not in the precision)


def kept_relative(outcomes: Sequence[Outcome], j8: np.ndarray) -> Scores:
    """The kept-relative scores of one system (definitions: the module docstring).
    `j8`: symmetric n x n matrix of J8 by stream position, NaN where undefined."""
    n = len(outcomes)
    if j8.shape != (n, n):
        raise ValueError(f"j8 is {j8.shape}, outcomes {n}")
    kept = np.array([o.decision == KEEP for o in outcomes], dtype=bool)
    dropped = np.array([o.decision in (DROP, CONTAINED) for o in outcomes], dtype=bool)
    named_j = []
    for i, o in enumerate(outcomes):
        if o.decision not in (DROP, CONTAINED):
            continue
        if o.named is None or not 0 <= o.named < i:
            raise ValueError(f"page {i}: a drop must name an earlier page, got {o.named}")
        if not kept[o.named]:
            raise ValueError(f"page {i}: names page {o.named}, which was not kept")
        if o.decision == DROP:
            named_j.append(j8[i, o.named])
    nj = np.array(named_j, dtype=float)
    defined = nj[~np.isnan(nj)]
    # best kept J8 of every page: its row over earlier kept columns (undefined -> -1)
    m = np.where(np.isnan(j8), -1.0, j8)
    m = np.where(kept[None, :], m, -1.0)
    m = np.where(np.tri(n, k=-1, dtype=bool), m, -1.0)
    best = m.max(axis=1) if n else np.zeros(0)
    judged = np.array([o.decision != SKIP for o in outcomes], dtype=bool)
    recall, sizes, hits = [], [], []
    for b, (lo, hi) in enumerate(BUCKETS):
        last = b == len(BUCKETS) - 1
        sel = judged & (best >= lo) & ((best <= hi) if last else (best < hi))
        sizes.append(int(sel.sum()))
        hits.append(int((sel & dropped).sum()))
        recall.append(hits[-1] / sizes[-1] if sizes[-1] else NAN)
    return Scores(
        kept=int(kept.sum()), drops=int(dropped.sum()),
        drops_no_j8=int(np.isnan(nj).sum()),
        precision=float((defined >= 0.8).mean()) if defined.shape[0] else NAN,
        drops_below_05=int((defined < 0.5).sum()),
        recall=recall, bucket_pages=sizes, bucket_dropped=hits,
        contained=sum(o.decision == CONTAINED for o in outcomes),
    )


# --- ground truth ------------------------------------------------------------------------------


def j8_matrix(c: Corpus) -> np.ndarray:
    """J8 of every pair of pages, by stream position (NaN: undefined), computed once.
    Pages with a non-empty shingle set: intersections from one sparse product (scipy, which
    datasketch installs) or, without scipy, pairwise; pages with an empty one: accuracy.jaccard."""
    n = len(c.pages)
    out = np.full((n, n), NAN)
    full = [i for i, s in enumerate(c.shingles) if s is not None and s.shape[0] > 0]
    try:
        from scipy import sparse
    except ImportError:
        sparse = None
    if sparse is not None and full:
        sets = [c.shingles[i] for i in full]
        assert all(s is not None for s in sets)
        allfp = np.concatenate(sets)  # type: ignore[arg-type]
        _, col = np.unique(allfp, return_inverse=True)
        row = np.repeat(np.arange(len(full)), [s.shape[0] for s in sets])  # type: ignore[union-attr]
        a = sparse.csr_matrix((np.ones(row.shape[0], dtype=np.int32), (row, col)),
                              shape=(len(full), int(col.max()) + 1))
        inter = (a @ a.T).toarray().astype(float)
        size = np.diag(inter).copy()
        j = inter / (size[:, None] + size[None, :] - inter)
        out[np.ix_(full, full)] = j
    else:
        for x, i in enumerate(full):
            for k in full[: x + 1]:
                out[i, k] = out[k, i] = jaccard(c, i, k)
    fullset = set(full)
    for i in range(n):
        if i in fullset or c.shingles[i] is None:
            continue
        for k in range(n):
            if c.shingles[k] is not None:
                out[i, k] = out[k, i] = jaccard(c, i, k)
    return out


def check_matrix(c: Corpus, j8: np.ndarray, samples: int = 300, seed: int = 3) -> None:
    """The matrix agrees with accuracy.jaccard on random pairs (or this run stops)."""
    rng = np.random.default_rng(seed)
    n = len(c.pages)
    for _ in range(samples):
        i, k = (int(x) for x in rng.integers(0, n, 2))
        want, got = jaccard(c, i, k), j8[i, k]
        if not (np.isnan(want) and np.isnan(got)) and abs(want - got) > 1e-9:
            raise SystemExit(f"{c.name}: J8 matrix {got} != jaccard {want} at ({i}, {k})")


# --- systems -----------------------------------------------------------------------------------

System = Callable[[Corpus], list[Outcome]]


def ours(settings: Settings) -> System:
    def run(c: Corpus) -> list[Outcome]:  # (run.settings: what the plot reads)
        dd = Deduplicator(settings)
        out: list[Outcome] = []
        where: dict[int, int] = {}  # kept page_id -> position
        for i, page in enumerate(c.pages):
            d = dd.check(page)
            if d.decision == "keep":
                assert d.page_id is not None
                where[d.page_id] = i
                out.append(Outcome(KEEP))
            elif d.decision == "drop":
                # a recrawl (issue 26) names its URL's version in `previous`
                named = d.duplicate_of or d.previous
                assert named is not None
                kind = CONTAINED if d.reason == CONTAINED else DROP
                out.append(Outcome(kind, where[named.page_id]))
            else:
                out.append(Outcome(SKIP))
        return out

    run.settings = settings  # type: ignore[attr-defined]
    return run


def _best(candidates: Sequence[int], m: Any, stored: dict[int, Any]) -> int:
    """The candidate whose min-hash estimates the highest Jaccard with m, oldest on a tie."""
    return min(candidates, key=lambda k: (-m.jaccard(stored[k]), k))


def datasketch_system(**lsh_kwargs: object) -> System:
    from datasketch import MinHash, MinHashLSH

    def run(c: Corpus) -> list[Outcome]:
        lsh = MinHashLSH(num_perm=84, **lsh_kwargs)  # type: ignore[arg-type]
        perms = MinHash(num_perm=84, scheme="affine64", hashfunc=int).permutations
        stored: dict[int, MinHash] = {}
        out: list[Outcome] = []
        for i, sh in enumerate(c.shingles):
            if sh is None:
                out.append(Outcome(SKIP))
                continue
            if sh.shape[0] == 0:
                out.append(Outcome(KEEP))
                continue
            m = MinHash(num_perm=84, scheme="affine64", hashfunc=int, permutations=perms)
            m.update_batch(sh)
            found = lsh.query(m)
            if found:
                out.append(Outcome(DROP, _best(found, m, stored)))
            else:
                lsh.insert(i, m, check_duplication=False)
                stored[i] = m
                out.append(Outcome(KEEP))
        return out

    return run


def datasketch_bands(threshold: float) -> tuple[int, int]:
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=84)
    return lsh.b, lsh.r


def rensa_system(num_perm: int, bands: int, threshold: float = 0.8) -> System:
    from rensa import RMinHash, RMinHashDeduplicator

    def run(c: Corpus) -> list[Outcome]:
        dedup = RMinHashDeduplicator(threshold, num_perm, True, bands, 42)
        stored: dict[int, RMinHash] = {}
        out: list[Outcome] = []
        for i, sh in enumerate(c.shingles):
            if sh is None:
                out.append(Outcome(SKIP))
                continue
            if sh.shape[0] == 0:
                out.append(Outcome(KEEP))
                continue
            raw = sh.astype("<u8").tobytes()
            m = RMinHash(num_perm, 42)
            m.update([raw[x : x + 8] for x in range(0, len(raw), 8)])
            found = [int(k) for k in dedup.get_duplicates(m)]
            if found:
                out.append(Outcome(DROP, _best(found, m, stored)))
            else:
                if not dedup.add(str(i), m):
                    raise SystemExit("rensa: add() found a duplicate get_duplicates() did not")
                stored[i] = m
                out.append(Outcome(KEEP))
        return out

    return run


def systems() -> tuple[dict[str, System], list[str]]:
    """Every system that can run here, and a note per one that cannot."""
    out: dict[str, System] = {
        "stream-dedup, defaults (bands 5x4, exact J, verify_rate=1)": ours(Settings()),
        "stream-dedup, verify_rate=0": ours(Settings(verify_rate=0.0)),
        "stream-dedup, bands 8x5": ours(Settings(bands=8, band_size=5)),
        "stream-dedup, bands=0 (features only), exact J": ours(Settings(bands=0)),
        "stream-dedup, bands 5x4, verify_exact=False": ours(Settings(verify_exact=False)),
        "stream-dedup before issue 16 (bands=0, verify_exact=False)": ours(
            Settings(bands=0, verify_exact=False)),
        "stream-dedup, verify_single_feature=False": ours(Settings(verify_single_feature=False)),
    }
    missing = []
    try:
        import datasketch  # noqa: F401

        b, r = datasketch_bands(0.8)
        out["datasketch MinHashLSH 84 perms, 6 bands of 14"] = datasketch_system(params=(6, 14))
        out[f"datasketch MinHashLSH 84 perms, threshold=0.8 ({b} bands of {r})"] = (
            datasketch_system(threshold=0.8))
    except ImportError:
        missing.append("datasketch is not installed (pip install '.[bench]'): its rows skipped")
    try:
        import rensa  # noqa: F401

        out["rensa RMinHashDeduplicator 84 perms, 6 bands, t=0.8"] = rensa_system(84, 6)
        out["rensa RMinHashDeduplicator 128 perms, 16 bands, t=0.8"] = rensa_system(128, 16)
    except ImportError:
        missing.append("rensa is not installed (pip install '.[bench]'): its rows skipped")
    return out, missing


# --- tables ------------------------------------------------------------------------------------


def load(name: str) -> Corpus:
    if name == "httpbis":
        return prepare("httpbis", benchlib.load_httpbis_pages())
    pages, _ = benchlib.load_warc_pages()
    return prepare("warc", pages)


Row = tuple[str, System, Scores, float]  # name, system, scores, seconds


def corpus_table(c: Corpus, runs: dict[str, System]) -> tuple[str, list[Row]]:
    t0 = time.perf_counter()
    j8 = j8_matrix(c)
    check_matrix(c, j8)
    truth_s = time.perf_counter() - t0
    rows, scored = [], []
    for name, system in runs.items():
        t = time.perf_counter()
        outcomes = system(c)
        seconds = time.perf_counter() - t
        s = kept_relative(outcomes, j8)
        scored.append((name, system, s, seconds))
        rows.append([
            name, s.kept, f"{s.drops} ({s.contained} contained)" if s.contained else s.drops,
            s.precision, s.drops_below_05, s.drops_no_j8,
            *(f"{r:.3f} ({h}/{n})" if n else "– (0)"
              for r, h, n in zip(s.recall, s.bucket_dropped, s.bucket_pages, strict=True)),
            seconds,
        ])
    short = sum(1 for s in c.shingles if s is not None and s.shape[0] == 0)
    rejected = sum(1 for s in c.shingles if s is None)
    return (
        table(["system", "kept", "drops", "precision (J8 ≥ 0.8)", "drops J8 < 0.5",
               "drops, no J8", "recall J8 0.8–0.9", "0.9–0.95", "0.95–1", "seconds"], rows)
        + f"\n\n{len(c.pages)} pages; {short} with fewer than 8 tokens (empty shingle set: "
        f"peers keep them unindexed), {rejected} rejected by our analyzer (a skip for every "
        f"system). Recall cells: share (dropped / later pages whose best J8 with a page the "
        f"system kept is in the bucket). seconds: stream-dedup's include its whole analysis "
        f"(parsing included), a peer's only its min-hashing and LSH over the given shingles. "
        f"J8 matrix in {truth_s:.1f} s.\n"
    ), scored


def plot(c: Corpus, scored: list[Row], png: Path) -> None:
    """Recall at J8 0.8-0.9 against RAM a kept page takes in the memory index's keys, for
    our rows (pages/s of the same run and precision by each point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    shown = 0
    for name, system, s, seconds in scored:
        settings = getattr(system, "settings", None)
        if settings is None or not settings.verify_single_feature or settings.verify_rate < 1:
            continue
        shown += 1
        ram = 16 + 8 * (settings.groups + settings.bands)  # exact layers + index keys
        exact = settings.verify_exact
        ax.scatter(ram, s.recall[0], s=60, marker="o" if exact else "s",
                   facecolors="tab:green" if exact else "none", edgecolors="tab:green")
        ax.annotate(f"{name.removeprefix('stream-dedup, ')}\n{len(c.pages) / seconds:.0f} "
                    f"pages/s, precision {s.precision:.2f}", (ram, s.recall[0]),
                    textcoords="offset points", xytext=(6, -14 if shown % 2 else 4),
                    fontsize=7)
    ax.axhline(0.9, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("RAM a kept page in the memory index's keys, B (exact layers 16 + 8 a key; "
                  "records on disk)")
    ax.set_ylabel("recall, later pages with a kept match at J8 0.8-0.9")
    ax.set_title(f"{c.name}: stream-dedup settings (filled: exact Jaccard; hollow: 84-hash "
                 "estimate)", fontsize=9)
    ax.set_xlim(50, 200)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=("httpbis", "warc", "both"), default="both")
    ap.add_argument("--plot", type=Path, default=Path(__file__).with_name("recall_engine.png"),
                    help="where the httpbis trade-off plot goes (bench/recall_engine.png)")
    args = ap.parse_args(argv)
    print(benchlib.header("# bench/kept_relative.py"))
    runs, missing = systems()
    for note in missing:
        print(f"**{note}**\n")
    names = ("httpbis", "warc") if args.corpus == "both" else (args.corpus,)
    titles = {"httpbis": "httpbis-drafts, revision order", "warc": "WARC set, replay order"}
    for name in names:
        t0 = time.perf_counter()
        c = load(name)
        print(f"## {titles[name]} (prepared in {time.perf_counter() - t0:.1f} s)\n")
        text, scored = corpus_table(c, runs)
        print(text, flush=True)
        if name == "httpbis":
            plot(c, scored, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
