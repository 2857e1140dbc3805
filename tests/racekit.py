"""Instances racing on one shared index: groups of mutual duplicates, one member per instance.

    python tests/racekit.py worker REDIS_URL INSTANCE GROUPS OUT START PACE INDEX

A worker is one instance (a process of its own): it decides member INSTANCE of every group,
in group order, in batches, through the real Deduplicator, and appends each batch's
decisions to OUT as it goes (a SIGKILL loses at most the batch in flight). Batch b starts
no earlier than START + b * PACE (epoch seconds), so the instances decide the same groups
at the same moments: the races are the point. Every member has
the page id a Kafka record would give it (models.position_id: group as time, instance as
partition), so an instance started again over the same input re-delivers the same pages.
`check` reads the decisions of every instance and counts what the protocol must never give.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MEMBERS = 4
T0 = 1_790_000_000_000  # ms: the groups' "crawl times" start here, a millisecond apart
BATCH = 25
JITTER_S = 0.015
_WORDS = [f"w{i}x{(i * 7919) % 1013}" for i in range(6000)]


def group_pages(g: int) -> list[tuple[str, bytes]]:
    """Four mutual duplicates: one word of 300 changed in each (near), and in every third
    group two members byte-identical (exact), in every third another two with the same
    text in other markup (canonical)."""
    rng = random.Random(g)
    base = [rng.choice(_WORDS) for _ in range(300)]
    out = []
    for m in range(MEMBERS):
        words = list(base)
        if not (g % 3 == 1 and m == 1):  # g % 3 == 1: member 1 is member 0's copy
            words[rng.randrange(300)] = f"changed{g}m{m}"
        if g % 3 == 1 and m == 1:
            words = out[0][2]
        if g % 3 == 2 and m == 3:  # the text of member 2, other markup
            words = out[2][2]
        tag = "div" if (g % 3 == 2 and m == 3) else "p"
        html = f"<html><body><{tag}>{' '.join(words)}</{tag}></body></html>".encode()
        out.append((f"http://g{g}.example.test/m{m}", html, words))
    return [(url, html) for url, html, _ in out]


def page_id(g: int, m: int) -> int:
    from stream_dedup.models import position_id

    return position_id(T0 + g, m, g)


def worker(url: str, instance: int, groups: int, out: Path, start_at: float, pace: float,
           index: str) -> None:
    from stream_dedup import Settings
    from stream_dedup.models import Page
    from stream_dedup.pipeline.deduplicator import Deduplicator

    settings = Settings(index=index, redis_url=url if index == "redis" else "")
    dd = Deduplicator(settings)
    if index == "redis":  # a random pause before every round trip: every interleaving
        rng = random.Random(instance)
        execute = dd.index._execute  # type: ignore[attr-defined]

        def jittered(pipe: object) -> list[object]:
            time.sleep(rng.random() * JITTER_S)
            return execute(pipe)

        dd.index._execute = jittered  # type: ignore[attr-defined]
    pages = []
    for g in range(groups):
        page_url, html = group_pages(g)[instance]
        pages.append(Page(page_url, html, (("Content-Type", "text/html"),),
                          source=f"race/{instance}/{g}", position=page_id(g, instance)))
    with open(out, "a") as fh:
        for b, i in enumerate(range(0, len(pages), BATCH)):
            time.sleep(max(0.0, start_at + b * pace - time.time()))
            batch = pages[i : i + BATCH]
            for page, d in zip(batch, decide_retrying(dd, batch), strict=True):
                dup = d.duplicate_of.page_id if d.duplicate_of else None
                fh.write(json.dumps([page.position, d.decision, d.reason, dup]) + "\n")
            fh.flush()
    stats = {k: getattr(dd.index, k, 0) for k in ("waits", "lost", "round_trips")}
    stats["retries"] = RETRIES[0]
    print(json.dumps(stats), flush=True)


RETRIES = [0]


def decide_retrying(dd: object, batch: list[object]) -> list[object]:
    """What the runner does with an index that cannot answer (a failover): the same batch
    again after a pause, nothing written until it is decided."""
    from stream_dedup.errors import IndexUnavailable

    delay = 0.1
    while True:
        try:
            return dd.check_batch(batch)  # type: ignore[attr-defined, no-any-return]
        except IndexUnavailable:
            RETRIES[0] += 1
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def start(url: str, instance: int, groups: int, out: Path, start_at: float, pace: float,
          index: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "worker", url, str(instance), str(groups), str(out),
         str(start_at), str(pace), index], stdout=subprocess.PIPE, text=True)


@dataclass
class Outcome:
    decided: int = 0
    double_keeps: int = 0  # pairs of kept members that are duplicates by the filter rule
    empty_groups: int = 0  # groups with no member kept
    dangling: int = 0  # drops whose duplicate_of is not a kept page
    changed: int = 0  # pages decided twice (re-delivery) with another decision
    retries: int = 0  # batches decided again because the index could not answer
    waits: int = 0  # pages that waited for an older page decided by another instance
    lost: int = 0  # claims lost to a concurrent instance (decided again)
    redelivered: int = 0  # pages the killed instance had decided, decided again


def read(path: Path) -> dict[int, list[object]]:
    out: dict[int, list[object]] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # the line a SIGKILL cut short
            continue
        out[row[0]] = row
    return out


def check(groups: int, decisions: dict[int, list[object]],
          earlier: dict[int, list[object]] | None = None) -> Outcome:
    """What the three promises forbid, counted. A pair of kept members is a double keep
    if the filter rule makes them duplicates (same raw or canonical fingerprint, or >= r
    shared features) and neither was kept as verified-distinct."""
    from stream_dedup import Settings
    from stream_dedup.models import Page
    from stream_dedup.pipeline.deduplicator import Analyzer

    settings = Settings()
    analyzer = Analyzer(settings)
    out = Outcome(decided=len(decisions))
    kept_ids = {pid for pid, d in decisions.items() if d[1] == "keep"}
    for g in range(groups):
        ids = [page_id(g, m) for m in range(MEMBERS)]
        assert all(i in decisions for i in ids), f"group {g} is not fully decided"
        kept = [m for m, i in enumerate(ids) if decisions[i][1] == "keep"]
        out.empty_groups += not kept
        analyses = {m: analyzer.analyze(Page(u, h, (("Content-Type", "text/html"),)))
                    for m, (u, h) in enumerate(group_pages(g)) if m in kept}
        for x in kept:
            for y in kept:
                if x < y and duplicates(analyses[x], analyses[y], settings) and \
                        "verified-distinct" not in (decisions[ids[x]][2], decisions[ids[y]][2]):
                    out.double_keeps += 1
        for i in ids:
            d = decisions[i]
            if d[1] == "drop" and d[3] not in kept_ids:
                out.dangling += 1
    for pid, d in (earlier or {}).items():
        out.changed += decisions[pid] != d
    return out


def duplicates(a: object, b: object, settings: object) -> bool:
    """The filter rule: the same raw or canonical fingerprint, or >= r shared features (the
    first k of `features`; the index keys after them, band and containment keys, are not
    features: two unrelated pages can share those)."""
    if a.raw_fp == b.raw_fp or (a.text_length and a.canonical_fp == b.canonical_fp):
        return True
    k = settings.groups
    shared = len(set(a.features[:k].tolist()) & set(b.features[:k].tolist()))
    return shared >= settings.threshold


def race(url: str, groups: int, tmp: Path, *, kill: int | None = None,
         index: str = "redis", pace: float = 0.1,
         fault: Callable[[], None] | None = None) -> Outcome:
    """Every instance at once, batch for batch; with `kill`, that instance is SIGKILLed
    mid-run and started again over its whole input (its pages are delivered again); with
    `fault`, it is called once 40 % of the way through (e.g. to kill a Redis primary)."""
    files = [tmp / f"instance{m}.jsonl" for m in range(MEMBERS)]
    start_at = time.time() + 4.0  # every process started and warm
    procs = [start(url, m, groups, files[m], start_at, pace, index) for m in range(MEMBERS)]
    earlier: dict[int, list[object]] = {}
    if kill is not None:
        while not files[kill].exists() or len(read(files[kill])) < groups * 2 // 5:
            time.sleep(0.05)
        procs[kill].kill()
        procs[kill].communicate()
        earlier = read(files[kill])
        again = tmp / f"instance{kill}-again.jsonl"
        procs[kill] = start(url, kill, groups, again, time.time(), 0.0, index)
        files[kill] = again
    if fault is not None:
        while not files[0].exists() or len(read(files[0])) < groups * 2 // 5:
            time.sleep(0.05)
        fault()
    waits = lost = retries = 0
    for p in procs:
        stdout, _ = p.communicate(timeout=900)
        assert p.returncode == 0, f"an instance failed (exit {p.returncode})"
        stats = json.loads(stdout.strip().splitlines()[-1])
        waits += stats["waits"]
        lost += stats["lost"]
        retries += stats["retries"]
    decisions: dict[int, list[object]] = {}
    for f in files:
        decisions.update(read(f))
    out = check(groups, decisions, earlier)
    out.waits, out.lost, out.retries, out.redelivered = waits, lost, retries, len(earlier)
    return out


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]),
               float(sys.argv[6]), float(sys.argv[7]), sys.argv[8])
