"""A churn campaign: `serve` instances on one Redis index, killed, stopped and added at random.

Used by tests/test_churn.py and bench/churn.py (what a campaign found is counted in
churncheck.py). `campaign` runs one group: N `python -m stream_dedup serve --index redis`
in one consumer group, each in a session (process group)
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
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from churncheck import TERM_BOUND_S, Result, Term, check, read_topic
from racekit import group_pages

REPO = Path(__file__).resolve().parents[1]
MODES: dict[str, tuple[str, ...]] = {"exactly-once": ("--exactly-once",), "at-least-once": ()}
HTML = (("Content-Type", "text/html"),)


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
