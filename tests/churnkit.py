"""A churn campaign: `serve` instances on one Redis index, killed, stopped and added at random.

Used by tests/test_churn.py and bench/churn.py. `campaign` runs one group: N `python -m
stream_dedup serve --index redis` in one consumer group, each in a session (process group)
of its own, logging to the campaign's directory; the pages of `crawl` produced, paced,
while every 2-5 s for `churn_s` a member is SIGKILLed or SIGTERMed (to its process group,
as Kubernetes signals a container) or one is added, one member always left; then the group
must decide every page, the members left are SIGTERMed, each given TERM_BOUND_S to exit (a
hung one gets SIGUSR1: its threads' stacks to its log; then SIGKILL), and every process
group started is SIGKILLed. `churn=False`: the same without churn. Every wait is bounded:
a hang becomes a `problems` line. `check` reads the topics (read_committed) and counts
what the promises forbid.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from racekit import duplicates, group_pages

REPO = Path(__file__).resolve().parents[1]
MODES: dict[str, tuple[str, ...]] = {"exactly-once": ("--exactly-once",), "at-least-once": ()}
TERM_BOUND_S = 40.0  # a SIGTERMed instance must exit (rc 0) within this
FINISH_TARGET_S = 30.0  # the target: every decision out this long after the churn
HTML = (("Content-Type", "text/html"),)
BAD = ("Future exception was never retrieved", "Traceback (most recent call last)")


@dataclass(frozen=True)
class Item:
    partition: int
    url: str
    html: bytes
    group: int  # -1: a unique page


def crawl(pages: int, partitions: int, seed: int, near_share: float = 0.6) -> list[Item]:
    """`pages` pages: near_share of them in groups of 4 mutual duplicates (member m of the
    i-th group on partition (i + m) % partitions), the rest unique; in a seeded order."""
    groups = int(pages * near_share) // 4
    base = seed * 1_000_000
    items = [Item((i + m) % partitions, url, html, base + i)
             for i in range(groups) for m, (url, html) in enumerate(group_pages(base + i))]
    for j in range(pages - 4 * groups):
        _, html = group_pages(base + 500_000 + j)[0]
        items.append(Item(j % partitions, f"http://u{base + j}.example.test/", html, -1))
    random.Random(seed).shuffle(items)
    return items


# --- Kafka --------------------------------------------------------------------------------
def topics(tag: str) -> dict[str, str]:
    tag = f"{tag}-{uuid.uuid4().hex[:8]}"
    return {"input": f"{tag}-pages", "decisions": f"{tag}-decisions", "kept": f"{tag}-kept",
            "dead": f"{tag}-dead", "group": f"{tag}-group", "tag": tag}


def admin(bootstrap: str, t: dict[str, str], partitions: int = 0) -> None:
    """Create the topics (the input with `partitions`), or (0) delete them, best effort."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def go() -> None:
        client = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await client.start()
        try:
            if partitions:
                await client.create_topics([NewTopic(t["input"], partitions, 1)] + [
                    NewTopic(t[k], 1, 1) for k in ("decisions", "kept", "dead")])
            else:
                await client.delete_topics([t[k] for k in ("input", "decisions", "kept",
                                                           "dead")])
        finally:
            await client.close()
    try:
        asyncio.run(asyncio.wait_for(go(), 60))
    except Exception as exc:
        if partitions:
            raise
        print(f"(topics of {t['tag']} not deleted: {exc!r})", file=sys.stderr)


def read_topic(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every message (kcat -J) as a read_committed reader sees it."""
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e",
                          "-J", "-q", "-X", "isolation.level=read_committed"],
                         capture_output=True, timeout=60)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


class Producer(threading.Thread):
    """The pages into the input topic, on their partitions, in ~1 s slices over `seconds`."""

    def __init__(self, bootstrap: str, topic: str, items: list[Item], seconds: float) -> None:
        super().__init__(daemon=True)
        self.args, self.error, self.done_at = (bootstrap, topic, items, seconds), "", 0.0
        self.sent_ms: dict[str, int] = {}  # source (topic/partition/offset) -> CreateTime

    def run(self) -> None:
        try:
            asyncio.run(self._go())
        except Exception as exc:  # noqa: BLE001
            self.error = repr(exc)
        self.done_at = time.monotonic()

    async def _go(self) -> None:
        from aiokafka import AIOKafkaProducer

        bootstrap, topic, items, seconds = self.args
        slices = max(1, round(seconds))
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        await producer.start()
        try:
            t0 = time.monotonic()
            for s in range(slices):
                await asyncio.sleep(max(0.0, t0 + s * seconds / slices - time.monotonic()))
                acks = [await producer.send(topic, json.dumps(
                    {"url": it.url, "html": it.html.decode()}).encode(), it.url.encode(),
                    partition=it.partition) for it in items[s::slices]]
                for meta in await asyncio.wait_for(asyncio.gather(*acks), 60):
                    self.sent_ms[f"{topic}/{meta.partition}/{meta.offset}"] = meta.timestamp
        finally:
            await producer.stop()


# --- instances ----------------------------------------------------------------------------
class Instance:
    def __init__(self, name: str, cmd: list[str], log: Path, code: Path) -> None:
        self.name, self.log, self.started = name, log, time.monotonic()
        self.fh = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.fh, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=code,
                                     env={**os.environ, "PYTHONPATH": str(code)})
        self.signalled: str = ""  # "kill", "term", "final" (the SIGTERM at the end)
        self.term_at = 0.0

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def running(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # the session's leader: its pid is the group's
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        self.signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.fh.close()


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


# --- one campaign ---------------------------------------------------------------------------
@dataclass
class Config:
    bootstrap: str
    redis_url: str
    mode: str
    items: list[Item]
    partitions: int
    logs: Path
    seed: int
    instances: int = 3
    max_members: int = 5
    churn_s: float = 20.0
    produce_s: float = 14.0
    batch_size: int = 50
    finish_limit_s: float = 120.0  # the most to wait for the last decision after the churn
    code: Path = REPO  # the checkout whose stream_dedup the instances run
    assign_limit_s: float = 120.0


def campaign(cfg: Config, churn: bool = True, delete: bool = False) -> Result:
    from indexkit import flush_redis

    flush_redis(cfg.redis_url)
    t = topics(f"churn-{'c' if churn else 's'}-{'eo' if cfg.mode == 'exactly-once' else 'alo'}"
               f"-{cfg.seed}")
    logs = cfg.logs / t["tag"]
    logs.mkdir(parents=True)
    res = Result(cfg.mode, churn, cfg.seed, len(cfg.items), logs)
    admin(cfg.bootstrap, t, cfg.partitions)
    cmd = [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers", cfg.bootstrap,
           "--input-topic", t["input"], "--decisions-topic", t["decisions"], "--kept-topic",
           t["kept"], "--dead-letter-topic", t["dead"], "--group-id", t["group"],
           "--http-port", "0", "--index", "redis", "--redis-url", cfg.redis_url,
           "--batch-size", str(cfg.batch_size), *MODES[cfg.mode]]
    rng = random.Random(cfg.seed)
    members: list[Instance] = []
    producer: Producer | None = None
    t0 = t0_wall = 0.0

    def join() -> Instance:
        m = Instance(f"i{len(members)}", cmd, logs / f"i{len(members)}.log", cfg.code)
        members.append(m)
        return m

    def reap(now: float) -> None:
        for m in members:
            rc = m.proc.poll()
            term = next((x for x in res.terms if x.name == m.name), None)
            if rc is not None and not m.signalled:
                m.signalled = "died"
                res.died.append((m.name, rc))
                res.events.append((now - t0, "died", m.name))
            elif term is not None and term.rc is None and term.seconds is None:
                if rc is not None:
                    term.rc, term.seconds = rc, now - t0 - term.at
                elif now - m.term_at > TERM_BOUND_S:
                    term.rc = -999
                    os.kill(m.proc.pid, signal.SIGUSR1)  # its threads' stacks, to its log
                    time.sleep(1.0)
                    m.signal(signal.SIGKILL)

    def terminate(m: Instance, now: float, final: bool) -> None:
        m.signalled, m.term_at = ("final" if final else "term"), now
        res.terms.append(Term(m.name, now - t0, final, now - m.started))
        m.signal(signal.SIGTERM)

    def pending() -> bool:
        return any(x.rc is None and x.seconds is None for x in res.terms)

    try:
        first = [join() for _ in range(cfg.instances)]
        deadline = time.monotonic() + cfg.assign_limit_s
        while not all("partitions assigned: ['" in m.text() for m in first):
            if time.monotonic() > deadline or any(not m.running() for m in first):
                res.setup_error = ("the first members were not all assigned partitions within "
                                   f"{cfg.assign_limit_s:.0f} s (or one exited)")
                return res
            time.sleep(0.3)
        t0, t0_wall = time.monotonic(), time.time()
        producer = Producer(cfg.bootstrap, t["input"], cfg.items, cfg.produce_s)
        producer.start()
        next_event, churn_end = t0 + rng.uniform(2, 5), t0 + (cfg.churn_s if churn else 0)
        while True:
            now = time.monotonic()
            reap(now)
            if churn and next_event <= now < churn_end:
                alive = [m for m in members if not m.signalled and m.running()]
                kinds = (["kill", "term"] if len(alive) > 1 else []) + (
                    ["join"] if len(alive) < cfg.max_members else [])
                kind = rng.choice(kinds)
                if kind == "join":
                    victim = join()
                else:
                    victim = rng.choice(alive)
                    if kind == "kill":
                        victim.signalled = "kill"
                        victim.signal(signal.SIGKILL)
                    else:
                        terminate(victim, now, final=False)
                res.events.append((now - t0, kind, victim.name))
                next_event += rng.uniform(2, 5)
            if now >= churn_end and not producer.is_alive():
                break
            if now > t0 + cfg.produce_s + 120:
                res.setup_error = "the producer did not finish within 120 s of its time"
                return res
            time.sleep(0.1)
        res.churn_end_s = time.monotonic() - t0
        if producer.error:
            res.setup_error = f"the producer failed: {producer.error}"
            return res
        res.produced_s = producer.done_at - t0
        limit = time.monotonic() + cfg.finish_limit_s
        while time.monotonic() < limit:
            reap(time.monotonic())
            decided = {json.loads(m["payload"])["source"]
                       for m in read_topic(cfg.bootstrap, t["decisions"])}
            res.decided = len(decided)
            if res.decided >= res.pages:
                break
            time.sleep(1.0)
        now = time.monotonic()
        for m in members:
            if not m.signalled and m.running():
                terminate(m, now, final=True)
        while pending():
            reap(time.monotonic())
            time.sleep(0.1)
    finally:
        for m in members:
            m.close()
        if producer is not None:
            producer.join(timeout=60)
        check(cfg, t, res, members, producer.sent_ms if producer else {}, t0_wall)
        if delete:
            admin(cfg.bootstrap, t)
    return res


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
        from stream_dedup.pipeline import Analyzer

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
        for key in own | {("f", int(f)) for f in a.features.tolist()}:
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
