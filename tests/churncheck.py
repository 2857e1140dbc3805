"""What a churn campaign (churnkit.py) found, counted: the decisions and kept topics read
as a read_committed reader sees them, the logs scanned, and `problems`: one line for each
promise broken (nothing missing or repeated, the kept topic exact, no drop against an
unkept page, no double keep by the filter rule, every SIGTERM answered by rc 0 within
TERM_BOUND_S, the group finished within FINISH_TARGET_S of the churn's end, no
"never retrieved" future or traceback in a log).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from racekit import duplicates

if TYPE_CHECKING:
    from churnkit import Config, Instance, Item

TERM_BOUND_S = 40.0  # a SIGTERMed instance must exit (rc 0) within this
FINISH_TARGET_S = 30.0  # the target: every decision out this long after the churn
HTML = (("Content-Type", "text/html"),)
BAD = ("Future exception was never retrieved", "Traceback (most recent call last)")


def read_topic(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every message (kcat -J) as a read_committed reader sees it."""
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e",
                          "-J", "-q", "-X", "isolation.level=read_committed"],
                         capture_output=True, timeout=60)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]



@dataclass
class Term:
    name: str
    at: float  # seconds after the first page was produced
    final: bool  # the SIGTERM at the end, not one of the churn's
    age: float  # seconds since the member was started
    rc: int | None = None
    seconds: float | None = None  # None: not gone within TERM_BOUND_S (then SIGKILLed)


@dataclass
class Result:
    mode: str
    churn: bool
    seed: int
    pages: int
    logs: Path
    events: list[tuple[float, str, str]] = field(default_factory=list)
    terms: list[Term] = field(default_factory=list)
    died: list[tuple[str, int]] = field(default_factory=list)  # exited unasked
    setup_error: str = ""
    produced_s: float = 0.0  # first page produced -> last page acknowledged
    churn_end_s: float = 0.0
    done_s: float | None = None  # first page produced -> every decision out
    latency_ms: list[int] = field(default_factory=list)  # page CreateTime -> its decision's
    decided = records = repeated = changed = rejects = keeps = 0
    kept_missing = kept_extra = kept_repeats = dangling = double_keeps = 0
    bad_lines: Counter[str] = field(default_factory=Counter)
    notes: Counter[str] = field(default_factory=Counter)
    evidence: str = ""

    @property
    def missing(self) -> int:
        return self.pages - self.decided

    @property
    def finish_s(self) -> float | None:
        """Seconds from the churn's end (still: the last page produced) to every decision."""
        end = self.churn_end_s if self.churn else self.produced_s
        return None if self.done_s is None else max(0.0, self.done_s - end)

    @property
    def rate(self) -> float | None:
        return None if not self.done_s else self.pages / self.done_s

    def latency(self, q: float) -> float | None:
        """Seconds from a page's CreateTime to its decision's, percentile q (100: max)."""
        xs = sorted(self.latency_ms)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] / 1000 if xs else None

    def counts(self) -> dict[str, int]:
        return {"kills": sum(e[1] == "kill" for e in self.events),
                "terms": sum(e[1] == "term" for e in self.events),
                "joins": sum(e[1] == "join" for e in self.events)}


def problems(r: Result, finish_bound: float = FINISH_TARGET_S) -> list[str]:
    """What the campaign must never show, one line each (empty: all held)."""
    if r.setup_error:
        return [r.setup_error] + [f"{n} x '{line}' in the logs" for line, n in
                                  r.bad_lines.items()]
    out = []
    if r.done_s is None:
        out.append(f"not finished: {r.decided} of {r.pages} pages decided, the last check "
                   "at the finish limit")
    elif (r.finish_s or 0) > finish_bound:
        out.append(f"finished {r.finish_s:.1f} s after the churn, bound {finish_bound:.0f} s")
    for what, n in (("missing decisions", r.missing), ("pages decided differently twice",
                    r.changed), ("rejects", r.rejects), ("keeps not on the kept topic",
                    r.kept_missing), ("kept-topic records of no keep", r.kept_extra),
                    ("drops against an unkept page", r.dangling),
                    ("double keeps by the filter rule", r.double_keeps)):
        if n:
            out.append(f"{n} {what}")
    if r.mode == "exactly-once" and r.repeated:
        out.append(f"{r.repeated} decisions repeated (exactly-once)")
    if r.mode == "exactly-once" and r.kept_repeats:
        out.append(f"{r.kept_repeats} kept pages repeated (exactly-once)")
    for t in r.terms:
        if t.seconds is None:
            out.append(f"{t.name} (SIGTERM at {t.at:.1f} s{', final' if t.final else ''}, "
                       f"{t.age:.1f} s after its start) did not exit within "
                       f"{TERM_BOUND_S:.0f} s")
        elif t.rc != 0:
            out.append(f"{t.name} exited {t.rc} {t.seconds:.1f} s after SIGTERM (sent "
                       f"{t.age:.1f} s after its start)")
    out += [f"{name} exited by itself with rc {rc}" for name, rc in r.died]
    out += [f"{n} x '{line}' in the logs" for line, n in r.bad_lines.items()]
    return out


def check(cfg: Config, t: dict[str, str], res: Result, members: list[Instance],
          sent_ms: dict[str, int], t0_wall: float) -> None:
    """The topics and the logs, counted into `res`. Times from the decisions' CreateTime
    (when the instance sent them; exactly-once: the copy a read_committed reader sees)."""
    by_url = {it.url: it for it in cfg.items}
    messages = read_topic(cfg.bootstrap, t["decisions"])
    decisions = [json.loads(m["payload"]) for m in messages]
    first: dict[str, dict[str, Any]] = {}
    seen: dict[str, set[tuple[Any, ...]]] = {}
    for m, d in zip(messages, decisions, strict=True):
        if d["source"] not in first:
            first[d["source"]] = d
            if d["source"] in sent_ms:
                res.latency_ms.append(m["ts"] - sent_ms[d["source"]])
                d["_ts"] = m["ts"]
        seen.setdefault(d["source"], set()).add(
            (d["decision"], d["reason"], json.dumps(d["duplicate_of"])))
    res.records, res.decided = len(decisions), len(first)
    if res.decided >= res.pages and t0_wall:
        res.done_s = max(d.get("_ts", 0) for d in first.values()) / 1000 - t0_wall
    res.repeated = res.records - res.decided
    res.changed = sum(len(v) > 1 for v in seen.values())
    res.rejects = sum(d["decision"] == "reject" for d in first.values())
    keeps = [d for d in first.values() if d["decision"] == "keep"]
    res.keeps = len(keeps)
    kept = Counter(m["key"] for m in read_topic(cfg.bootstrap, t["kept"]))
    want = Counter(d["url"] for d in keeps)
    res.kept_missing = len(set(want) - set(kept))  # a keep whose page is not there
    res.kept_extra = sum(n for url, n in kept.items() if url not in want)  # no keep's page
    res.kept_repeats = sum(max(0, kept[url] - 1) for url in want)  # copies beyond one
    ids = {d["page_id"] for d in keeps}
    res.dangling = sum(d["decision"] == "drop" and d["duplicate_of"] is not None
                       and d["duplicate_of"]["page_id"] not in ids for d in first.values())
    res.double_keeps = double_keeps([(by_url[d["url"]], d["reason"]) for d in keeps
                                     if d["url"] in by_url])
    res.notes, res.bad_lines, res.evidence = scan_logs(members, res)


_ANALYSES: dict[str, Any] = {}


def analysis(url: str, html: bytes) -> Any:
    if url not in _ANALYSES:
        from stream_dedup import Settings
        from stream_dedup.models import Page
        from stream_dedup.pipeline.deduplicator import Analyzer

        _ANALYSES[url] = _ANALYSES.setdefault("", Analyzer(Settings())).analyze(
            Page(url, html, HTML))
    return _ANALYSES[url]


def double_keeps(kept: list[tuple[Item, str]]) -> int:
    """Pairs of kept pages that the filter rule makes duplicates (same raw or canonical
    fingerprint, or >= r shared features), neither kept as verified-distinct."""
    from stream_dedup import Settings

    settings = Settings()
    keys: dict[tuple[str, int], list[int]] = {}
    analyses = [analysis(it.url, it.html) for it, _ in kept]
    for i, a in enumerate(analyses):
        own = {("r", a.raw_fp)} | ({("c", a.canonical_fp)} if a.text_length else set())
        for key in own | {("f", int(f)) for f in a.features[:settings.groups].tolist()}:
            keys.setdefault(key, []).append(i)
    pairs = {(x, y) for posting in keys.values() for x in posting for y in posting if x < y}
    return sum(duplicates(analyses[x], analyses[y], settings) and "verified-distinct" not in
               (kept[x][1], kept[y][1]) for x, y in pairs)


def scan_logs(members: list[Instance], res: Result) -> tuple[Counter[str], Counter[str], str]:
    """WARNING/ERROR lines (numbers as N) counted; BAD lines counted; the evidence: each BAD
    line with what follows it, and the tail of every member that hung, failed or died."""
    notes: Counter[str] = Counter()
    bad: Counter[str] = Counter()
    parts = []
    failed = {t.name for t in res.terms if t.rc != 0 or t.seconds is None
              or (res.done_s is None and t.final)} | {n for n, _ in res.died}
    for m in members:
        lines = m.text().splitlines()
        for i, line in enumerate(lines):
            if " WARNING " in line or " ERROR " in line:
                text = re.sub(r"churn-[cs]-[a-z]+-\d+-[0-9a-f]+", "<tag>", line.split(
                    " WARNING ", 1)[-1].split(" ERROR ", 1)[-1])
                notes[re.sub(r"\d+(\.\d+)?", "N", text)[:160]] += 1
            for b in BAD:
                if b in line:
                    bad[b] += 1
                    if bad[b] <= 3:
                        parts.append(f"--- {m.name}.log line {i + 1}:\n" +
                                     "\n".join(lines[max(0, i - 3):i + 25]))
        if m.name in failed:
            parts.append(f"--- last lines of {m.name}.log:\n" + "\n".join(lines[-60:]))
    return notes, bad, "\n".join(parts)[-20000:]
