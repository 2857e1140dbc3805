"""`stream-dedup clusters DECISIONS...`: the clusters a run's decisions name.

Broder, Glassman, Manasse and Zweig (1997) cluster the web by resemblance: every pair of
documents at or above a bar joins one cluster (union-find over the pairs). The stream
builds its clusters as it decides: each kept page is its cluster's representative, and
every page dropped against it (exact, canonical, near, near-verified, contained) or found
unchanged at its URL joins it, so a decision's `cluster` is known the moment it is made
(decide/step.py). This module reads decisions (JSON lines, as `replay -o` and the decisions
topic write them) and tells what those clusters are: how many, their sizes, the largest
with their representatives; `--csv` writes one row per page.

Pure but for reading and writing the files named.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIZES = ((1, 1), (2, 2), (3, 5), (6, 10), (11, 100), (101, None))
CSV_FIELDS = ("source", "url", "decision", "reason", "page_id", "cluster", "cluster_url")


@dataclass
class Cluster:
    page_id: str  # as decisions carry it (decimal; an older file's integer, as text)
    url: str | None = None  # the representative's URL (None: kept before these decisions)
    size: int = 0
    reasons: Counter[str] = field(default_factory=Counter)


@dataclass
class Summary:
    clusters: dict[str, Cluster] = field(default_factory=dict)
    pages: int = 0
    rejected: int = 0
    unreadable: list[str] = field(default_factory=list)  # "file:line: why"

    def add(self, d: dict[str, Any]) -> None:
        self.pages += 1
        cluster = _id(d.get("cluster"))
        if d.get("decision") == "reject" or cluster is None:
            self.rejected += 1
            return
        c = self.clusters.get(cluster)
        if c is None:
            c = self.clusters[cluster] = Cluster(cluster)
        c.size += 1
        c.reasons[f"{d.get('decision')} {d.get('reason')}"] += 1
        if c.url is None:
            c.url = _representative_url(d, cluster)

    def histogram(self) -> list[tuple[str, int, int]]:
        """(size range, clusters, pages in them)."""
        out = []
        for lo, hi in SIZES:
            sizes = [c.size for c in self.clusters.values()
                     if c.size >= lo and (hi is None or c.size <= hi)]
            name = f"{lo}" if lo == hi else f"{lo}+" if hi is None else f"{lo}-{hi}"
            out.append((name, len(sizes), sum(sizes)))
        return out

    def largest(self, n: int) -> list[Cluster]:
        # ids in numeric order: decimal strings without leading zeros by length, then text
        return sorted(self.clusters.values(),
                      key=lambda c: (-c.size, len(c.page_id), c.page_id))[:n]

    def render(self, top: int = 10) -> str:
        multi = sum(1 for c in self.clusters.values() if c.size > 1)
        lines = [f"pages {self.pages:,}: {len(self.clusters):,} clusters ({multi:,} with more "
                 f"than one page), {self.rejected:,} rejected (no cluster)",
                 "size       clusters      pages"]
        lines += [f"{name:<8} {n:>10,} {p:>10,}" for name, n, p in self.histogram()]
        if self.clusters:
            lines.append(f"largest {min(top, len(self.clusters))}:")
            for c in self.largest(top):
                how = ", ".join(f"{k} {v}" for k, v in c.reasons.most_common())
                lines.append(f"  {c.size:>6,}  {c.url or '(kept before these decisions)'}"
                             f"  [cluster {c.page_id}: {how}]")
        if self.unreadable:
            lines.append(f"UNREADABLE LINES ({len(self.unreadable)}):")
            lines += [f"  {why}" for why in self.unreadable[:20]]
        return "\n".join(lines)


def _id(value: object) -> str | None:
    """A page id as a string: decisions carry strings, files written before ints."""
    return None if value is None else str(value)


def _representative_url(d: dict[str, Any], cluster: str) -> str | None:
    """The URL of the cluster's kept page, as far as this decision tells it."""
    if d.get("decision") == "keep" and _id(d.get("page_id")) == cluster:
        return str(d.get("url"))
    for name in ("duplicate_of", "previous"):
        ref = d.get(name)
        if isinstance(ref, dict) and _id(ref.get("page_id")) == cluster:
            return str(ref.get("url"))
    return None


def decision_lines(path: str) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """Each line of a JSON-lines file of decisions (`-`: standard input) with its number:
    the decision, or why it is none ("not JSON", bad UTF-8 too; "not a decision")."""
    fh = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115
    try:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                yield n, "not JSON"
                continue
            yield n, d if isinstance(d, dict) and "decision" in d else "not a decision"
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()


def read_decisions(paths: Iterable[str], unreadable: list[str]) -> Iterator[dict[str, Any]]:
    """Each decision of the JSON-lines files; a line that is not a decision object is named
    in `unreadable` and skipped."""
    for path in paths:
        for n, d in decision_lines(path):
            if isinstance(d, str):
                unreadable.append(f"{path}:{n}: {d}")
            else:
                yield d


def summarize(paths: Iterable[str], csv_path: str | None = None) -> Summary:
    """The clusters of the decisions in `paths`; with `csv_path`, one row per page too
    (its cluster's URL filled in once the whole input is read)."""
    summary = Summary()
    rows: list[dict[str, Any]] = []
    for d in read_decisions(paths, summary.unreadable):
        summary.add(d)
        if csv_path is not None:
            rows.append({k: d.get(k) for k in CSV_FIELDS[:-1]})
    if csv_path is not None:
        with open(csv_path, "w", newline="", encoding="utf-8") as fh:
            out = csv.DictWriter(fh, CSV_FIELDS)
            out.writeheader()
            for row in rows:
                cluster = _id(row["cluster"])
                c = None if cluster is None else summary.clusters.get(cluster)
                out.writerow({**row, "cluster_url": c.url if c is not None else None})
    return summary


def check_inputs(paths: Iterable[str]) -> list[str]:
    """The inputs that are not readable files (`-` is)."""
    return [p for p in paths if p != "-" and not Path(p).is_file()]
