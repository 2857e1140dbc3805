"""Recrawls on a natural one: the IETF httpbis drafts, each document one URL, its revisions
its fetches (../shared/corpora/httpbis-drafts).

Each published document (p1-messaging ... p7-auth) is fetched at every revision 00..N in
revision order, then each editor's-draft series (cache, messaging: consecutive commits)
under its own URL. Prints, per bucket of the exact J8 between a revision and the one before
it (the corpus's ground truth, `published-adjacent` and `editors-consecutive-sample`), how
many fetches were decided unchanged / changed (or anything else), and what the index holds
at the end per distinct URL.

    python3 bench/recrawl.py                 # this checkout
    PYTHONPATH=OLD_CHECKOUT python3 bench/recrawl.py   # the code before, same table

The code before issue 26 has no `unchanged`/`changed`: its recrawls are drops of their own
URL (exact, near, near-verified) or `unique` keeps, and the table shows that instead.
"""

from __future__ import annotations

import csv
import sys
from collections import Counter, defaultdict
from pathlib import Path

from stream_dedup import Deduplicator, Page, Settings

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpora" / "httpbis-drafts"
BUCKETS = [(0.0, 0.5), (0.5, 0.8), (0.8, 0.9), (0.9, 0.95), (0.95, 0.99), (0.99, 1.01)]


def fetches() -> list[tuple[str, str, str]]:
    """(url, path, the path of the fetch before it under that URL or "") in crawl order."""
    with open(CORPUS / "manifest.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    published = sorted((r for r in rows if r["set"] == "published"),
                       key=lambda r: (int(r["revision"]), r["doc"]))
    editors = sorted((r for r in rows if r["set"] == "editors"), key=lambda r: r["path"])
    out, last = [], {}
    for r in published + editors:
        url = f"https://httpwg.example/{r['set']}/draft-ietf-httpbis-{r['doc']}"
        out.append((url, r["path"], last.get(url, "")))
        last[url] = r["path"]
    return out


def ground_truth() -> dict[tuple[str, str], float]:
    with open(CORPUS / "pairs_groundtruth.csv", newline="") as fh:
        return {(r["a"], r["b"]): float(r["jaccard_w8"]) for r in csv.DictReader(fh)
                if r["relation"] in ("published-adjacent", "editors-consecutive-sample")}


def main() -> int:
    if not CORPUS.is_dir():
        print(f"no corpus at {CORPUS}", file=sys.stderr)
        return 2
    truth = ground_truth()
    dd = Deduplicator(Settings())
    table: dict[tuple[float, float] | str, Counter[str]] = defaultdict(Counter)
    own = 0  # drops naming their own URL as the duplicate
    for url, path, before in fetches():
        page = Page(url, (CORPUS / path).read_bytes(), (("Content-Type", "text/html"),))
        d = dd.check(page)
        label = f"{d.decision} {d.reason}"
        if d.duplicate_of is not None and d.duplicate_of.url == url:
            own += 1
            label += " (of itself)"
        j = truth.get((before, path))
        bucket: tuple[float, float] | str = (
            "first fetch" if not before else "no ground truth" if j is None else
            next(b for b in BUCKETS if b[0] <= j < b[1]))
        table[bucket][label] += 1
    urls = len({u for u, _, _ in fetches()})
    print(f"{'J8 to the fetch before':<24} decisions")
    order: list[tuple[float, float] | str] = ["first fetch", *BUCKETS, "no ground truth"]
    for bucket in order:
        if bucket in table:
            name = bucket if isinstance(bucket, str) else f"[{bucket[0]:.2f}, {bucket[1]:.2f})"
            print(f"{name:<24} " + ", ".join(f"{k} {v}" for k, v in sorted(table[bucket].items())))
    fetched = sum(sum(c.values()) for c in table.values())
    print(f"\nfetches {fetched}, distinct URLs {urls}, drops naming their own URL {own}")
    print(f"index: {len(dd.index)} pages held, {len(dd.index) / urls:.2f} a URL")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
