"""Decisions -> what the report shows, in one pass and bounded memory (pure: no I/O).

A `Tally` takes the decisions one at a time, in the order they were made, as the JSON
objects replay writes (a decisions file is input from anyone: every field is read as
what it should be or as absent, never trusted). It counts everything and keeps a bounded
sample of what is shown one by one: per reason the `per_reason` drops closest to the bar
they passed (the borderline ones, where a wrong drop would be), and the
`verified-distinct` keeps closest to the bar they missed; the members of the largest
clusters; the kept pages' sources, so that a drop's view can find the page it names.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

KEEP_REASONS = ("unique", "changed", "verified-distinct")
DROP_REASONS = ("exact", "canonical", "near", "near-verified", "contained", "unchanged",
                "superseded")
OUTCOMES = {"keep": 0, "drop": 1, "reject": 2}
BAR = 0.8  # verify_min_jaccard's default: where a verified pair is judged, when not told
CLUSTER_MEMBERS = 40  # members listed of a cluster
CLUSTERS_KEPT = 12  # largest clusters shown
UNSCORED = 1e9  # the margin of a drop without a score (+ drops before it naming its page)


def text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def ident(value: object) -> str | None:
    """A page id as decisions carry it (a decimal string; older files: an integer)."""
    if isinstance(value, str) and value.isdigit():
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    return None


def host_of(url: str | None) -> str:
    try:
        return (urlsplit(url).hostname or "(no host)") if url else "(no URL)"
    except ValueError:
        return "(bad URL)"


@dataclass
class Pair:
    """A decision shown side by side with the page it names (`other_*`)."""

    position: int  # 0-based, in the decisions
    decision: str
    reason: str
    url: str | None
    source: str | None
    scores: dict[str, Any]
    other_url: str | None = None
    other_id: str | None = None
    other_source: str | None = None
    margin: float = math.inf  # how far from its bar: smaller is more borderline
    anchor: str = ""

    def label(self) -> str:
        return f"{self.decision} {self.reason}"


@dataclass
class Cluster:
    page_id: str
    size: int = 0
    url: str | None = None
    # (position, reason, url) of the first CLUSTER_MEMBERS members
    members: list[tuple[int, str, str | None]] = field(default_factory=list)


@dataclass
class Tally:
    per_reason: int = 12  # drop pairs kept per reason
    bar: float = BAR
    pages: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # keep / drop / reject
    reasons: Counter[tuple[str, str]] = field(default_factory=Counter)
    codes: bytearray = field(default_factory=bytearray)  # one outcome a decision, in order
    scores: dict[str, list[float]] = field(default_factory=dict)  # "jaccard drop" -> values
    hosts: dict[str, Counter[str]] = field(default_factory=dict)
    recrawls: dict[str, Counter[str]] = field(default_factory=dict)  # host -> changed/same
    clusters: dict[str, Cluster] = field(default_factory=dict)
    kept_sources: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    short: int = 0
    verified: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)
    _samples: dict[str, list[tuple[float, int, int]]] = field(default_factory=dict)  # heaps
    _sampled: dict[int, Pair] = field(default_factory=dict)  # by position
    _named: Counter[tuple[str, str | None]] = field(default_factory=Counter)  # unscored drops

    def bad(self, where: str) -> None:
        self.bad_lines += 1
        if len(self.bad_examples) < 20:
            self.bad_examples.append(where)

    def add(self, d: dict[str, Any], where: str = "") -> None:
        decision = text(d.get("decision"))
        reason = text(d.get("reason")) or "(none)"
        if decision not in OUTCOMES:
            self.bad(f"{where}: not a keep, drop or reject decision")
            return
        position = self.pages
        self.pages += 1
        self.outcomes[decision] += 1
        self.reasons[(decision, reason)] += 1
        self.codes.append(OUTCOMES[decision])
        url = text(d.get("url"))
        if decision == "reject":
            return
        self.short += d.get("short") is True
        self.verified += d.get("verified") is True
        host = self.hosts.setdefault(host_of(url), Counter())
        host[decision] += 1
        previous = d.get("previous") if isinstance(d.get("previous"), dict) else None
        if previous is not None:
            same = "unchanged" if reason in ("unchanged", "superseded") else \
                "changed" if reason == "changed" else "other"
            self.recrawls.setdefault(host_of(url), Counter())[same] += 1
        page_id = ident(d.get("page_id"))
        if decision == "keep" and page_id is not None:
            self.kept_sources[page_id] = (text(d.get("source")), url)
        self._score(decision, reason, d)
        self._cluster(d, position, decision, reason, url, page_id)
        self._sample(d, position, decision, reason, url, previous)

    def _score(self, decision: str, reason: str, d: dict[str, Any]) -> None:
        group = "drop" if decision == "drop" else reason
        # a contained page is judged by its containment; its Jaccard is lower by design
        names = ("containment",) if reason == "contained" else ("jaccard", "resemblance")
        for name in names:
            v = number(d.get(name))
            if v is not None and 0 <= v <= 1 and group in ("drop", "verified-distinct"):
                self.scores.setdefault(f"{name} {group}", []).append(v)

    def _cluster(self, d: dict[str, Any], position: int, decision: str, reason: str,
                 url: str | None, page_id: str | None) -> None:
        cid = ident(d.get("cluster"))
        if cid is None:
            return
        c = self.clusters.get(cid)
        if c is None:
            c = self.clusters[cid] = Cluster(cid)
        c.size += 1
        if decision == "keep" and page_id == cid:
            c.url = url
        if len(c.members) < CLUSTER_MEMBERS:
            c.members.append((position, reason, url))

    def _sample(self, d: dict[str, Any], position: int, decision: str, reason: str,
                url: str | None, previous: dict[str, Any] | None) -> None:
        if decision == "keep" and reason != "verified-distinct" or self.per_reason <= 0:
            return
        # keep the per_reason most borderline; without a score (exact, canonical), the
        # first drop against each kept page before a second against one; among equals, a
        # spread along the input (a hash of the position, not the first ones)
        ref = d.get("duplicate_of")
        ref = ref if isinstance(ref, dict) else previous
        margin = self._margin(reason, d)
        if margin == math.inf:
            named = (reason, ident(ref.get("page_id")) if ref is not None else None)
            margin = UNSCORED + self._named[named]
            self._named[named] += 1
        key = (-margin, -((position * 0x9E3779B1) & 0xFFFFFFFF), position)
        heap = self._samples.setdefault(reason, [])
        if len(heap) >= self.per_reason:
            if key <= heap[0]:
                return
            del self._sampled[heapq.heapreplace(heap, key)[2]]
        else:
            heapq.heappush(heap, key)
        scores = {k: v for k in ("jaccard", "resemblance", "ld_estimate", "containment",
                                 "shared_features", "verified", "short")
                  if (v := d.get(k)) is not None and v is not False
                  and not (k == "shared_features" and v == 0)}
        pair = Pair(position, decision, reason, url, text(d.get("source")), scores, margin=margin)
        if ref is not None:
            pair.other_url = text(ref.get("url"))
            pair.other_id = ident(ref.get("page_id"))
            if pair.other_id is not None and pair.other_id in self.kept_sources:
                pair.other_source = self.kept_sources[pair.other_id][0]
            if previous is not None and previous.get("match"):
                scores["match"] = text(previous.get("match"))
        self._sampled[position] = pair

    def _margin(self, reason: str, d: dict[str, Any]) -> float:
        """How far the pair is from the bar it was judged by (0: at the bar)."""
        if reason == "contained":
            c = number(d.get("containment"))
            return math.inf if c is None else c - 0.9
        j = number(d.get("jaccard"))
        j = j if j is not None else number(d.get("resemblance"))
        if j is None:
            return math.inf
        return abs(j - self.bar)

    def pairs(self) -> dict[str, list[Pair]]:
        """Per reason, the sampled pairs, most borderline first."""
        out = {}
        for reason, heap in self._samples.items():
            pairs = sorted((self._sampled[k[2]] for k in heap),
                           key=lambda p: (p.margin, p.position))
            for n, p in enumerate(pairs):
                p.anchor = f"pair-{reason}-{n}"
            out[reason] = pairs
        return dict(sorted(out.items(), key=lambda kv: _reason_order(kv[0])))

    def largest_clusters(self) -> list[Cluster]:
        multi = [c for c in self.clusters.values() if c.size > 1]
        return heapq.nsmallest(CLUSTERS_KEPT, multi,
                               key=lambda c: (-c.size, len(c.page_id), c.page_id))

    def cluster_sizes(self) -> Counter[int]:
        return Counter(c.size for c in self.clusters.values())

    def along(self, bins: int = 60) -> list[tuple[int, int, int]]:
        """(kept, dropped, rejected) in each of `bins` equal stretches of the input."""
        n = len(self.codes)
        if n == 0:
            return []
        bins = min(bins, n)
        out = []
        for b in range(bins):
            part = self.codes[b * n // bins:(b + 1) * n // bins]
            out.append((part.count(0), part.count(1), part.count(2)))
        return out

    def top_hosts(self, n: int = 15) -> list[tuple[str, Counter[str]]]:
        return sorted(self.hosts.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:n]

    def top_recrawled(self, n: int = 15) -> list[tuple[str, Counter[str]]]:
        return sorted(self.recrawls.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))[:n]


def _reason_order(reason: str) -> tuple[int, str]:
    order = (*DROP_REASONS, "verified-distinct")
    return (order.index(reason), reason) if reason in order else (len(order), reason)
