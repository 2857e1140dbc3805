#!/usr/bin/env python3
"""The stream's clusters against Broder, Glassman, Manasse and Zweig's (1997) on the same
pages: pairwise precision and recall of "in the same cluster".

Theirs (004): every pair of pages whose resemblance is at or above a bar joins one cluster,
by union-find over all the pairs (transitively: a chain of close pairs is one cluster). The
exact J8 of every pair comes from bench/kept_relative.py's matrix (word 8-shingles of the
text our analyzer extracts). Ours: each decision's `cluster` (the kept page it joins, its
own when kept), the pages in stream order through `Deduplicator.check`, default settings.

Pairwise, over every pair of pages both systems cluster (rejects and pages without
shingles aside): precision = share of our same-cluster pairs that are in one union-find
cluster; recall = share of the union-find same-cluster pairs that we put in one cluster.
Recall below 1 is by design where 004's clusters chain (A~B, B~C, A and C far apart): the
stream never joins two kept pages. Also printed: clusters and pages in clusters of 2+.

    python3 bench/clusters.py                       # httpbis and the WARC set, bar 0.8
    python3 bench/clusters.py --corpus httpbis --bar 0.9
"""

from __future__ import annotations

import argparse
import sys
import time
from itertools import combinations
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from benchlib import table  # noqa: E402
from kept_relative import Corpus, j8_matrix, load  # noqa: E402

from stream_dedup import Settings  # noqa: E402
from stream_dedup.pipeline.deduplicator import Deduplicator  # noqa: E402


def union_find(j8: np.ndarray, judged: list[int], bar: float) -> dict[int, int]:
    """004's clusters: position -> its cluster's root, over pairs with J8 >= bar."""
    parent = {i: i for i in judged}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    rows, cols = np.nonzero(np.nan_to_num(j8, nan=-1.0) >= bar)
    judged_set = set(judged)
    for i, k in zip(rows.tolist(), cols.tolist(), strict=True):
        if i < k and i in judged_set and k in judged_set:
            a, b = root(i), root(k)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {i: root(i) for i in judged}


def ours(c: Corpus, settings: Settings) -> dict[int, int]:
    """Position -> the stream's cluster id, for every page it did not reject."""
    dd = Deduplicator(settings)
    out = {}
    for i, page in enumerate(c.pages):
        d = dd.check(page)
        if d.cluster is not None:
            out[i] = d.cluster
    dd.close()
    return out


def same_pairs(assign: dict[int, int], judged: list[int]) -> set[tuple[int, int]]:
    groups: dict[int, list[int]] = {}
    for i in judged:
        groups.setdefault(assign[i], []).append(i)
    return {pair for members in groups.values() for pair in combinations(sorted(members), 2)}


def score(c: Corpus, bars: list[float], settings: Settings) -> str:
    t = time.perf_counter()
    j8 = j8_matrix(c)
    truth_s = time.perf_counter() - t
    t = time.perf_counter()
    stream = ours(c, settings)
    ours_s = time.perf_counter() - t
    judged = [i for i in sorted(stream) if c.shingles[i] is not None
              and c.shingles[i].shape[0] > 0]  # type: ignore[union-attr]
    mine = same_pairs(stream, judged)
    rows = []
    for bar in bars:
        theirs_map = union_find(j8, judged, bar)
        theirs = same_pairs(theirs_map, judged)
        both = len(mine & theirs)
        counts = np.unique(list(theirs_map.values()), return_counts=True)[1]
        multi_theirs = int((counts > 1).sum())
        rows.append([f"{bar:.2f}", len(set(theirs_map.values())), multi_theirs, len(theirs),
                     len(mine), both / len(mine) if mine else float("nan"),
                     both / len(theirs) if theirs else float("nan")])
    ours_counts = np.unique([stream[i] for i in judged], return_counts=True)[1]
    multi_ours = int((ours_counts > 1).sum())
    return (table(["bar (J8)", "004 clusters", "of 2+ pages", "004 same-cluster pairs",
                   "our same-cluster pairs", "pairwise precision", "pairwise recall"], rows)
            + f"\n\n{len(judged)} pages judged; ours: {len(ours_counts)} "
            f"clusters, {multi_ours} of 2+ pages ({ours_s:.1f} s); J8 matrix "
            f"{truth_s:.1f} s.\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=("httpbis", "warc", "both"), default="both")
    ap.add_argument("--bar", type=float, nargs="+", default=[0.8, 0.9],
                    help="004's resemblance bars (J8) to compare with (0.8 0.9)")
    args = ap.parse_args(argv)
    print(benchlib.header("# bench/clusters.py"))
    for name in ("httpbis", "warc") if args.corpus == "both" else (args.corpus,):
        c = load(name)
        print(f"## {name}\n")
        print(score(c, args.bar, Settings()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
