"""Shared parts of the benchmarks that run `serve` against a real broker (exactly_once.py,
latency.py): a broker of their own, the service as a child process of a checkout, a
read_committed reader noting when each decision arrived, a producer offering pages at a
fixed rate, CPU use over a window, and percentiles of the rounds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from benchlib import REPO
from throughput import cpu_since, cpu_snapshot, log_time

KAFKA_LOCAL = REPO / "deploy" / "kafka-local"
ASSIGNED = re.compile(r"partitions assigned: \['")
STALL_S = 60.0  # no new decision for this long: the phase fails
NOTE = re.compile(r" (WARNING|ERROR|CRITICAL) ")


# --- the broker -------------------------------------------------------------------------------


def free_low_port(taken: set[int]) -> int:
    """A port nothing listens on, below the ephemeral range (a broker restarted on it could
    otherwise meet a client's own outgoing port; deploy/kafka-local --help)."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20_000, 32_000)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise SystemExit("no free port between 20000 and 32000")


@dataclass
class Broker:
    directory: Path | None  # None: a broker this script did not start
    bootstrap: str

    @classmethod
    def start(cls, directory: Path) -> Broker:
        port = free_low_port(set())
        env = {**os.environ, "KAFKA_LOCAL_PORT": str(port),
               "KAFKA_LOCAL_CONTROLLER_PORT": str(free_low_port({port}))}
        done = subprocess.run([str(KAFKA_LOCAL), "start", str(directory)], env=env,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"kafka-local start failed:\n{done.stderr[-2000:]}")
        return cls(directory, done.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        if self.directory is None:
            return
        subprocess.run([str(KAFKA_LOCAL), "stop", str(self.directory)], capture_output=True,
                       timeout=120)
        shutil.rmtree(self.directory, ignore_errors=True)

    def cpu(self) -> float | None:
        if self.directory is None:
            return None
        try:
            return cpu_seconds(int((self.directory / "kafka.pid").read_text().strip()))
        except (OSError, ValueError):
            return None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the service ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topics:
    input: str
    decisions: str
    kept: str
    dead: str
    group: str

    @classmethod
    def of(cls, tag: str) -> Topics:
        return cls(f"{tag}-pages", f"{tag}-decisions", f"{tag}-kept", f"{tag}-dead",
                   f"{tag}-group")

    def all(self, exactly_once: bool) -> list[str]:
        changelog = [f"{self.group}-index-changelog"] if exactly_once else []
        return [self.input, self.decisions, self.kept, self.dead, *changelog]


class Service:
    """`python -m stream_dedup serve` of a checkout (this one unless `code`) as a child
    process."""

    def __init__(self, bootstrap: str, t: Topics, flags: Sequence[str], log: Path,
                 code: Path = REPO) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = log
        self.command = [sys.executable, "-P", "-m", "stream_dedup", "serve", "--bootstrap-servers",
                        bootstrap, "--input-topic", t.input, "--decisions-topic", t.decisions,
                        "--kept-topic", t.kept, "--dead-letter-topic", t.dead, "--group-id",
                        t.group, "--http-port", str(self.port), *flags]
        self.fh = open(log, "wb")  # noqa: SIM115 (closed by stop)
        # The checkout's package first on the path (-P: not the working directory), for
        # the worker processes too: an editable install may point elsewhere.
        self.proc = subprocess.Popen(self.command, stdout=self.fh, stderr=subprocess.STDOUT,
                                     cwd=code, env={**os.environ, "PYTHONPATH": str(code)})

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def assigned(self) -> float:
        """Unix time of the first "partitions assigned" line naming a partition."""
        timeout = 120.0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.text().splitlines():
                if ASSIGNED.search(line) and (when := log_time(line)) is not None:
                    return when
            self.check_alive()
            await asyncio.sleep(0.05)
        raise SystemExit(f"no partition assigned within {timeout:.0f} s:\n{self.tail()}")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise SystemExit(f"serve exited with {self.proc.returncode}:\n{self.tail()}")

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            self.fh.close()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def notes(self) -> list[str]:
        """WARNING and ERROR lines, without their time and this phase's names."""
        out = []
        for line in self.text().splitlines():
            if NOTE.search(line):
                line = re.sub(r"^\S+ \S+ ", "", line)
                line = re.sub(r"r\d+-[\w-]+?-(pages|decisions|kept|dead|group)",
                              r"<\1>", line)
                out.append(re.sub(r"\b\d+\b", "N", line)[:220])
        return out


def counters(m: dict[str, float]) -> dict[str, float]:
    return {
        "batches": m.get("stream_dedup_batches_total", 0.0),
        "committed": m.get('stream_dedup_kafka_transactions_total{outcome="committed"}', 0.0),
        "aborted": m.get('stream_dedup_kafka_transactions_total{outcome="aborted"}', 0.0),
        "commit_s": m.get("stream_dedup_kafka_commit_seconds_sum", 0.0),
        "commits": m.get("stream_dedup_kafka_commit_seconds_count", 0.0),
    }


# --- the downstream reader --------------------------------------------------------------------


class Watcher:
    """Reads the decisions topic all along, as a downstream consumer would
    (read_committed), and notes when each page's first decision arrived."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.tp = TopicPartition(topic, 0)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest",
            fetch_max_wait_ms=50)
        self.first: dict[str, tuple[float, int]] = {}  # source -> (received, its CreateTime)
        self.records = 0
        self.mix: Counter[str] = Counter()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.assign([self.tp])
        await self.consumer.seek_to_beginning(self.tp)
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            got = await self.consumer.getmany(self.tp, timeout_ms=200)
            received = time.time()
            for r in got.get(self.tp, []):
                self.records += 1
                d = json.loads(r.value)
                if d["source"] not in self.first:
                    self.first[d["source"]] = (received, r.timestamp)
                    self.mix[f"{d['decision']}/{d['reason']}"] += 1

    async def until(self, sources: set[str], service: Service) -> None:
        """Wait until every one of `sources` has a decision; fails after STALL_S without one."""
        left, stalled = len(sources), time.monotonic() + STALL_S
        while True:
            now_left = len(sources - self.first.keys())
            if now_left == 0:
                return
            if now_left < left:
                left, stalled = now_left, time.monotonic() + STALL_S
            if time.monotonic() > stalled:
                raise SystemExit(f"{left} of {len(sources)} pages without a decision after "
                                 f"{STALL_S:.0f} s without progress:\n{service.tail()}")
            service.check_alive()
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.consumer.stop()


# --- a window's CPU, a phase's result, producing ----------------------------------------


@dataclass
class Usage:
    """CPU seconds over a window, and the host's use in % (200 % = both of two cores)."""

    service: float
    broker: float  # NaN: a broker this script did not start
    own: float  # this process: the producer and the read_committed reader
    host: float
    others: float  # host % that was none of the three: the rest of the machine


class CpuClock:
    """Started at the beginning of a window; `stop` gives its Usage."""

    def __init__(self, svc: Service, broker: Broker) -> None:
        self.svc, self.broker = svc, broker
        self.wall, self.host = time.monotonic(), cpu_snapshot()
        self.service0, self.broker0, self.own0 = svc.cpu(), broker.cpu(), time.process_time()

    def stop(self) -> Usage:
        wall, host = time.monotonic() - self.wall, cpu_since(self.host)
        broker1 = self.broker.cpu()
        usage = Usage(self.svc.cpu() - self.service0,
                      broker1 - self.broker0 if broker1 and self.broker0 else math.nan,
                      time.process_time() - self.own0, host.busy if host else math.nan,
                      math.nan)
        ours = usage.service + (0 if math.isnan(usage.broker) else usage.broker) + usage.own
        usage.others = usage.host - 100 * ours / wall
        return usage


@dataclass
class Result:
    mode: str
    test: str  # "backlog" or the rate
    pages: int
    seconds: float  # backlog: from assignment to the last decision visible; rate: the window
    steady: float = math.nan  # backlog: pages/s from the first decision seen
    first_s: float = math.nan  # backlog: seconds from the assignment to the first decision
    offered: float = math.nan  # rate: pages/s actually sent
    sent_ms: list[float] = field(default_factory=list)
    visible_ms: list[float] = field(default_factory=list)
    counts: dict[str, float] = field(default_factory=dict)  # the window's metrics deltas
    cpu: Usage | None = None
    duplicates: int = 0  # decisions visible beyond one a page
    starts_over: int = 0
    exit_code: int | None = None
    mix: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.pages / self.seconds


async def produce_all(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                max_batch_size=1 << 20)
    await producer.start()
    try:
        for i in range(0, len(messages), 500):
            acks = [await producer.send(topic, v, key=k) for k, v in messages[i:i + 500]]
            await asyncio.gather(*acks)
    finally:
        await producer.stop()


async def offer(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]],
                rate: float) -> tuple[dict[str, int], float, float]:
    """Send `messages` at `rate` a second (each as soon as its time comes; late ones at
    once); (source -> the page's CreateTime in ms, Unix time of the first send, seconds from
    the first send to the last)."""
    # Batches up to 1 MB: with aiokafka's 16 KB, a larger page is a batch of its own, and a
    # send waits for the one before it (one request in flight a partition): the offered
    # rate would be one page a round trip.
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0,
                                max_batch_size=1 << 20)
    await producer.start()
    try:
        acks = []
        first, started = time.time(), time.perf_counter()
        for i, (key, value) in enumerate(messages):
            wait = started + i / rate - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            acks.append(await producer.send(topic, value, key=key))
        took = time.perf_counter() - started
        metas = await asyncio.gather(*acks)
    finally:
        await producer.stop()
    return {f"{topic}/{m.partition}/{m.offset}": m.timestamp for m in metas}, first, took


async def input_sources(bootstrap: str, topic: str) -> set[str]:
    """topic/partition/offset of every record in the topic (its end offsets)."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await c.start()
    try:
        parts = c.partitions_for_topic(topic) or set()
        if not parts:
            await c._client.force_metadata_update()
            parts = c.partitions_for_topic(topic) or set()
        ends = await c.end_offsets([TopicPartition(topic, p) for p in parts])
    finally:
        await c.stop()
    return {f"{topic}/{tp.partition}/{o}" for tp, end in ends.items() for o in range(end)}


# --- figures ----------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile, nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else math.nan


def quarter(values: Sequence[float], which: int) -> float:
    """p50 of the `which`-th quarter of `values` (0 = the first pages sent)."""
    n = len(values)
    return pct(values[which * n // 4:(which + 1) * n // 4], 50)


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def spread(values: Sequence[float], fmt: str = "{:.0f}") -> str:
    """median (min-max) of the rounds."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(med(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def workdir(prefix: str, logs: Path | None) -> tuple[Path, Path]:
    """A new temporary directory for a run and its service logs (`logs`, if given), made.
    aiokafka's warnings are silenced: a reader that assigns a topic made a moment ago warns
    until the topic's metadata and leader are there, and retries; no figure depends on it."""
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    logs = logs or work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return work, logs
