#!/usr/bin/env python3
"""Throughput benchmark: pages/s through the Kafka service vs `replay`, one worker vs two.

A script that prints figures, not a test; the only thing it checks is that the service makes
exactly the decisions replay makes. In one run it:

1. builds a page set: the real HTML pages of ../shared/corpora/warc (854, read in place),
   cycled up to --pages; every copy after the first gets a distinct HTML comment and a
   distinct short paragraph, so it is neither an exact duplicate (its bytes differ) nor a
   canonical one (its text differs a little): copies go through sketching, the index and
   verification, like real near-duplicates (with 5000 pages about 66 % near drops, 17 %
   keep/unique, 12 % drop/exact from the corpus's own copies, 4 % drop/canonical; printed).
   --synthetic uses `stream_dedup.cli.sample.build()` pages (seeds 1, 2, ...) instead. The pages
   are written once to a temporary JSONL file (body_b64 form);
2. times `stream_dedup.replay.run.replay` over that file (decisions serialized to /dev/null, as
   `replay -o` would write them) with 1 and 2 workers, median of --repeat passes: the whole
   call (worker pool start and stop included), and from the first batch's decisions to the
   last (the steady rate, comparable to the service's "from first decision");
3. produces the same lines to a fresh input topic (timed separately; the topic allows
   messages as large as the largest page), then per worker count spawns `python -m
   stream_dedup serve` (fresh group id, fresh output topics, HTTP API on a free port), polls
   the decisions topic's end offset every 20 ms until it holds one decision per page, and
   SIGTERMs it. Reported from process spawn (interpreter start, imports, worker pool,
   connecting, joining the group, first fetch) and from the first decision seen: (pages -
   decisions already there) / (end - that moment). All bench-* topics are deleted at the end;
4. prints a table with pages/s, the ratio to replay with one worker and the host's CPU use
   during each measurement, the decision mix (replay's and the service's, which must agree)
   and the machine.

Reading the numbers on a shared machine:
- host CPU counts every process (/proc/stat; 200 % = both of two cores). A workers=1 pass
  should show ~100 % (replay) or ~110 % (service + broker ~5 % + this poller ~3 %); more is
  someone else's load, and that pass ran slower.
- "parallel ceiling" (printed before and after) = work two CPU-bound processes get done at
  once relative to one alone: 2.0 on two free cores; on a shared VM it can sit near 1.0, and
  then no workers=2 figure can beat it.
- service batches are capped by the consumer's fetch size (max_partition_fetch_bytes, 8 MiB
  + 64 KiB for the default max_page_bytes), not only by --batch-size: with ~62 kB messages a
  batch holds ~128 records whatever a larger --batch-size says (the mean is printed).
- with fewer than ~10 batches per pass the "from first decision" rows mean little (said so).
- --phases adds one pass of replay and one of the service (in-process, HTTP API off) per
  worker count with the wall time of each step of the batch loop summed: getmany, records ->
  pages, check_batch, produce + acks, commit. (cProfile on `serve` would not do: the decide
  step runs in a worker thread, which cProfile does not see.)
- do not edit stream_dedup/ during a run: workers=2 pools import the package afresh from
  disk, so a mid-run change can break them (BrokenProcessPool).

    python bench/throughput.py                      # 5000 corpus pages, 3 passes (~4 min)
    python bench/throughput.py --pages 1000 --repeat 1
    python bench/throughput.py --synthetic --bootstrap 127.0.0.1:9092 --phases
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import re
import shlex
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from benchlib import parallel_ceiling

from stream_dedup import Settings
from stream_dedup.models import Decision, Page
from stream_dedup.pipeline.deduplicator import Deduplicator
from stream_dedup.replay.run import ReplaySummary, replay
from stream_dedup.sinks.files import JsonlSink
from stream_dedup.sources.files import iter_inputs

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpora" / "warc"
ARCHIVES = (".warc", ".warc.gz", ".arc", ".arc.gz")
PRODUCE_BATCH = 1 << 20  # bytes of one producer batch (the input topic allows more)

EPILOG = """\
examples:
  python bench/throughput.py --pages 1000 --repeat 1     # a quick look (about a minute)
  python bench/throughput.py                             # 5000 corpus pages, median of 3
  python bench/throughput.py --synthetic --batch-size 100
  python bench/throughput.py --only replay --workers 1,2

The broker must be running (deploy/kafka-local start /tmp/kafka-dev). Topics are created with
random names (bench-<id>-...) and deleted at the end unless --keep-topics. Settings from
STREAM_DEDUP_* environment variables apply to replay and to the service alike.
"""


# --- the page set ---------------------------------------------------------------------------


def corpus_pages(root: Path) -> list[Page]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(ARCHIVES))
    if not files:
        raise SystemExit(f"throughput: no WARC/ARC files under {root}")
    return [item for item in iter_inputs(files) if isinstance(item, Page)]


def synthetic_pages(n: int) -> list[Page]:
    from stream_dedup.cli.sample import build

    pages: list[Page] = []
    seed = 1
    while len(pages) < n:
        for sp in build(seed):
            url = sp.url.replace("://example.test/", f"://s{seed}.example.test/", 1)
            pages.append(Page(url=url, body=sp.html.encode("utf-8"),
                              headers=(("Content-Type", sp.content_type),)))
        seed += 1
    return pages[:n]


def cycled(base: list[Page], n: int) -> Iterator[Page]:
    """`n` pages: `base` in order, again and again; copy k >= 1 of a page gets a distinct
    comment and paragraph (new raw bytes, slightly different text: a near-duplicate)."""
    for i in range(n):
        page, copy = base[i % len(base)], i // len(base)
        if copy == 0:
            yield page
            continue
        suffix = f"\n<!-- bench copy {copy} -->\n<p>bench copy {copy} marker</p>\n".encode()
        yield Page(url=f"{page.url}#bench-copy-{copy}", body=page.body + suffix,
                   headers=page.headers, fetched_at=page.fetched_at, status=page.status)


def message(page: Page) -> bytes:
    """The JSONL / Kafka message form of a page (raw bytes as body_b64, original headers)."""
    obj: dict[str, object] = {"url": page.url, "body_b64": base64.b64encode(page.body).decode(),
                              "headers": [list(h) for h in page.headers]}
    if page.fetched_at:
        obj["fetched_at"] = page.fetched_at
    if page.status is not None:
        obj["status"] = page.status
    return json.dumps(obj).encode()


@dataclass
class PageSet:
    path: Path
    pages: int
    distinct_bases: int
    total_bytes: int  # page bodies
    message_bytes: int  # JSON lines, without newlines
    largest_message: int


def write_page_set(args: argparse.Namespace, path: Path) -> PageSet:
    if args.synthetic:
        base = synthetic_pages(args.pages)
    else:
        base = corpus_pages(Path(args.corpus))
    total = msg_total = largest = 0
    with open(path, "wb") as fh:
        for page in cycled(base, args.pages):
            line = message(page)
            fh.write(line + b"\n")
            total += len(page.body)
            msg_total += len(line)
            largest = max(largest, len(line))
    return PageSet(path, args.pages, len(base), total, msg_total, largest)


def read_lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        for line in fh:
            yield line.rstrip(b"\n")


# --- replay -----------------------------------------------------------------------------------


class TimingSink:
    """Writes through to `inner`; notes when the first batch's decisions are out and when
    the last one is."""

    def __init__(self, inner: JsonlSink, first_batch: int) -> None:
        self.inner, self.first_batch = inner, first_batch
        self.count, self.first_at, self.last_at = 0, 0.0, 0.0

    def write(self, decision: Decision) -> None:
        self.inner.write(decision)
        self.count += 1
        self.last_at = time.perf_counter()
        if self.count == self.first_batch:
            self.first_at = self.last_at

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()


def replay_pass(path: Path, settings: Settings, workers: int, n: int
                ) -> tuple[Pass, Pass, ReplaySummary]:
    """(the whole call, from the first batch's output to the last decision, summary)."""
    sink = TimingSink(JsonlSink(os.devnull), min(settings.batch_size, n))
    cpu = cpu_snapshot()
    started = time.perf_counter()
    summary = replay([path], sink, settings, workers=workers)
    seconds = time.perf_counter() - started
    steady = Pass(n - sink.first_batch, sink.last_at - sink.first_at, None)
    return Pass(summary.pages, seconds, cpu_since(cpu)), steady, summary


# --- Kafka ------------------------------------------------------------------------------------


async def create_topics(bootstrap: str, topics: dict[str, dict[str, str]],
                        partitions: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, partitions, 1, topic_configs=cfg) for name, cfg in topics.items()],
            timeout_ms=30_000)
        errors = [e for e in response.topic_errors if e[1] != 0]
        if errors:
            raise SystemExit(f"throughput: could not create topics: {errors}")
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, topics: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(topics, timeout_ms=30_000)
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, path: Path, max_bytes: int) -> float:
    """Every line of `path` as one message (key = its URL); seconds until all are acked."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                max_batch_size=PRODUCE_BATCH, max_request_size=max_bytes)
    await producer.start()
    started = time.perf_counter()
    try:
        acks = []
        for line in read_lines(path):
            url = json.loads(line)["url"]
            acks.append(await producer.send(topic, line, key=url.encode()))
            if len(acks) >= 500:
                await asyncio.gather(*acks)
                acks = []
        await asyncio.gather(*acks)
    finally:
        await producer.stop()
    return time.perf_counter() - started


@dataclass
class KafkaRun:
    workers: int
    pages: int
    total_s: float  # spawn -> last decision seen
    first_s: float  # spawn -> first decision seen
    first_count: int  # decisions already there at that moment
    ready_s: float | None  # spawn -> "connected; consuming" in the service log
    batches: int | None
    cpu_total: CpuUse | None = None  # host CPU from spawn to the last decision
    cpu_steady: CpuUse | None = None  # from the first decision to the last
    mix: Counter[str] = field(default_factory=Counter)
    log: Path | None = None

    @property
    def steady_pages(self) -> int:
        return self.pages - self.first_count

    @property
    def steady_s(self) -> float:
        return self.total_s - self.first_s


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def log_time(line: str) -> float | None:
    m = LOG_TIME.match(line)
    if not m:
        return None
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1e3


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def open_log(path: Path) -> BinaryIO:
    return open(path, "wb")  # noqa: SIM115 (a with-block in the caller closes it)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_env() -> dict[str, str]:
    """The environment of `serve`: ours, with its HTTP API (where it has one) on a free port,
    so that a service already running on the default port does not make it fail."""
    env = dict(os.environ)
    if "http_port" in Settings.names() and "STREAM_DEDUP_HTTP_PORT" not in env:
        env["STREAM_DEDUP_HTTP_PORT"] = str(free_port())
    return env


def serve_command(args: argparse.Namespace, input_topic: str, decisions: str, dead: str,
                  group: str, workers: int) -> list[str]:
    cmd = [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers", args.bootstrap,
           "--input-topic", input_topic, "--decisions-topic", decisions,
           "--dead-letter-topic", dead, "--group-id", group, "--workers", str(workers)]
    if args.batch_size is not None:
        cmd += ["--batch-size", str(args.batch_size)]
    return cmd


async def kafka_pass(args: argparse.Namespace, input_topic: str, n: int, workers: int,
                     tag: str, logdir: Path, created: list[str]) -> KafkaRun:
    decisions, dead = f"{tag}-decisions", f"{tag}-dead-letter"
    await create_topics(args.bootstrap, {decisions: {}, dead: {}})
    created += [decisions, dead]
    tp = TopicPartition(decisions, 0)
    watcher = AIOKafkaConsumer(bootstrap_servers=args.bootstrap, enable_auto_commit=False)
    await watcher.start()
    log_path = logdir / f"{tag}.log"
    try:
        await watcher.end_offsets([tp])  # connected before the clock starts
        cmd = serve_command(args, input_topic, decisions, dead, f"{tag}-group", workers)
        with open_log(log_path) as log:
            cpu0 = cpu_snapshot()
            wall0, t0 = time.time(), time.perf_counter()
            proc = await asyncio.create_subprocess_exec(*cmd, stdout=log, stderr=log,
                                                        env=serve_env())
            first: tuple[float, int] | None = None
            cpu1 = cpu_total = cpu_steady = None
            try:
                while True:
                    end = (await watcher.end_offsets([tp]))[tp]
                    now = time.perf_counter() - t0
                    if end > 0 and first is None:
                        first, cpu1 = (now, end), cpu_snapshot()
                    if end >= n:
                        cpu_total, cpu_steady = cpu_since(cpu0), cpu_since(cpu1)
                        break
                    if proc.returncode is not None:
                        raise SystemExit(f"throughput: serve exited with {proc.returncode} after "
                                         f"{end} decisions; its log:\n{tail(log_path)}")
                    if now > args.timeout:
                        raise SystemExit(f"throughput: {end}/{n} decisions after {now:.0f} s; "
                                         f"the service's log:\n{tail(log_path)}")
                    await asyncio.sleep(args.poll)
            finally:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        await asyncio.wait_for(proc.wait(), timeout=120)
                    except TimeoutError:
                        proc.kill()
                        await proc.wait()
        if proc.returncode != 0:
            raise SystemExit(f"throughput: serve exited with {proc.returncode} after SIGTERM; "
                             f"its log:\n{tail(log_path)}")
        assert first is not None
        mix = await read_mix(watcher, tp, n)
    finally:
        await watcher.stop()
    ready = batches = None
    for line in log_path.read_text(errors="replace").splitlines():
        if "connected; consuming" in line and (t := log_time(line)) is not None:
            ready = t - wall0
        m = re.search(r"stopped after (\d+) records in (\d+) batches", line)
        if m:
            batches = int(m.group(2))
    return KafkaRun(workers, n, now, first[0], first[1], ready, batches, cpu_total, cpu_steady,
                    mix, log_path)


async def read_mix(consumer: AIOKafkaConsumer, tp: TopicPartition, n: int) -> Counter[str]:
    """decision/reason counts of the first n decisions of the topic (not timed)."""
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    mix: Counter[str] = Counter()
    seen = 0
    while seen < n:
        got = await consumer.getmany(tp, timeout_ms=2000, max_records=5000)
        if not got:
            break
        for rec in got.get(tp, []):
            if seen < n:
                d = json.loads(rec.value)
                mix[f"{d['decision']}/{d['reason']}"] += 1
                seen += 1
    return mix


# --- where the time goes (--phases) -----------------------------------------------------------


class PhaseClock:
    """Adds up wall time per phase by wrapping methods (restored by `undo`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._undo: list[tuple[object, str, object]] = []

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def wrap(self, owner: object, name: str, phase: str) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, original))
        clock = self
        if asyncio.iscoroutinefunction(original):
            async def timed_async(*a: object, **k: object) -> object:
                started = time.perf_counter()
                try:
                    return await original(*a, **k)
                finally:
                    clock.add(phase, time.perf_counter() - started)
            setattr(owner, name, timed_async)
        else:
            def timed(*a: object, **k: object) -> object:
                started = time.perf_counter()
                try:
                    return original(*a, **k)
                finally:
                    clock.add(phase, time.perf_counter() - started)
            setattr(owner, name, timed)

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def replay_phases(path: Path, settings: Settings, workers: int) -> tuple[float, dict[str, float]]:
    clock = PhaseClock()
    clock.wrap(Deduplicator, "check_batch", "check_batch (parse HTML, sketch, decide)")
    try:
        started = time.perf_counter()
        replay([path], JsonlSink(os.devnull), settings, workers=workers)
        total = time.perf_counter() - started
    finally:
        clock.undo()
    clock.add("read JSONL + write decisions + pool", total - sum(clock.seconds.values()))
    return total, clock.seconds


async def service_phases(args: argparse.Namespace, input_topic: str, n: int, workers: int,
                         tag: str, created: list[str]) -> tuple[float, dict[str, float]]:
    """One in-process service pass with its batch loop's phases timed."""
    from stream_dedup.kafka.edges import KafkaSink, KafkaSource
    from stream_dedup.kafka.service import serve
    from stream_dedup.runner import loop as runner

    decisions, dead = f"{tag}-decisions", f"{tag}-dead-letter"
    await create_topics(args.bootstrap, {decisions: {}, dead: {}})
    created += [decisions, dead]
    overrides: dict[str, object] = {
        "bootstrap_servers": args.bootstrap, "input_topic": input_topic,
        "decisions_topic": decisions, "dead_letter_topic": dead, "group_id": f"{tag}-group",
        "workers": workers, "batch_size": args.batch_size}
    if "http_port" in Settings.names():
        overrides["http_port"] = 0  # in-process: no HTTP API (it may clash with a real one)
    settings = Settings.load(overrides=overrides)
    stop = asyncio.Event()
    clock = PhaseClock()
    process = runner.Runner.process
    run = runner.Runner.run

    async def counted(self: runner.Runner, *rest: Any) -> None:
        started = time.perf_counter()
        try:
            await process(self, *rest)
        finally:
            clock.add("(process)", time.perf_counter() - started)
        if self.stats.records >= n:
            stop.set()

    async def timed_run(self: runner.Runner, *rest: Any) -> None:
        clock.wrap(self.source.consumer, "getmany",  # type: ignore[attr-defined]
                   "getmany (waiting for records)")
        started = time.perf_counter()
        try:
            await run(self, *rest)
        finally:
            clock.add("(run)", time.perf_counter() - started)

    clock.wrap(KafkaSource, "item", "records -> pages (JSON, base64; decide thread)")
    clock.wrap(Deduplicator, "check_batch", "check_batch (parse HTML, sketch, decide)")
    clock.wrap(KafkaSink, "_send", "produce decisions + wait for acks")
    runner.Runner.process, runner.Runner.run = counted, timed_run  # type: ignore[method-assign]
    try:
        code = await serve(settings, stop)
    finally:
        runner.Runner.process, runner.Runner.run = process, run  # type: ignore[method-assign]
        clock.undo()
    if code != 0 or not stop.is_set():
        raise SystemExit(f"throughput: the in-process service stopped with {code} before "
                         f"deciding {n} pages (see the log above)")
    out = clock.seconds
    total, in_process = out.pop("(run)", 0.0), out.pop("(process)", 0.0)
    out["commit offsets + bookkeeping"] = in_process - sum(
        v for k, v in out.items() if not k.startswith("getmany"))
    return total, out


def print_phases(title: str, total: float, phases: dict[str, float], pages: int) -> None:
    print(f"{title}: {total:.2f} s, {pages / total:.1f} pages/s")
    for phase, secs in phases.items():
        print(f"  {phase:<44} {secs:7.2f} s  {100 * secs / total:5.1f} %")


# --- CPU accounting (Linux /proc/stat; None elsewhere) ---------------------------------------


@dataclass
class CpuUse:
    busy: float  # percent of one CPU, summed over all CPUs (200 % = both cores of two)
    steal: float  # percent of one CPU taken by the hypervisor for other guests


def cpu_snapshot() -> tuple[int, int, int] | None:
    """(busy, steal, total) jiffies of the whole host since boot."""
    try:
        with open("/proc/stat") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (values + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def cpu_since(start: tuple[int, int, int] | None) -> CpuUse | None:
    end = cpu_snapshot()
    if start is None or end is None or end[2] <= start[2]:
        return None
    total, cpus = end[2] - start[2], os.cpu_count() or 1
    return CpuUse(100 * cpus * (end[0] - start[0]) / total,
                  100 * cpus * (end[1] - start[1]) / total)




# --- output -----------------------------------------------------------------------------------


@dataclass
class Pass:
    pages: int
    seconds: float
    cpu: CpuUse | None


@dataclass
class Row:
    mode: str
    workers: int
    passes: list[Pass] = field(default_factory=list)

    def median(self, values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    @property
    def rate(self) -> float:  # median of the passes' rates (their page counts may differ)
        return self.median([p.pages / p.seconds for p in self.passes if p.seconds > 0])


def print_table(rows: list[Row]) -> None:
    base = next((r.rate for r in rows if r.mode == "replay" and r.workers == 1), None)
    head = (f"{'mode':<33} {'workers':>7} {'pages':>6} {'seconds':>8} {'pages/s':>8} "
            f"{'vs replay w=1':>13} {'host CPU':>8} {'steal':>6}  passes (min..max s)")
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = f"{r.rate / base:.2f}x" if base else "n/a"
        secs = [p.seconds for p in r.passes]
        pages = sorted({p.pages for p in r.passes})
        npages = str(pages[0]) if len(pages) == 1 else f"~{round(r.median(pages))}"
        cpus = [p.cpu for p in r.passes if p.cpu is not None]
        cpu = f"{r.median([c.busy for c in cpus]):.0f} %" if cpus else "n/a"
        steal = f"{r.median([c.steal for c in cpus]):.0f} %" if cpus else "n/a"
        spread = f"{len(secs)}: {min(secs):.2f}..{max(secs):.2f}" if len(secs) > 1 else "1"
        print(f"{r.mode:<33} {r.workers:>7} {npages:>6} {r.median(secs):>8.2f} {r.rate:>8.1f} "
              f"{ratio:>13} {cpu:>8} {steal:>6}  {spread}")


def print_mix(title: str, mix: Counter[str], total: int) -> None:
    print(title)
    for key, count in sorted(mix.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {key:<28} {count:>7}  {100 * count / total:5.1f} %")


def machine() -> str:
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count() or 0
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({affinity} usable), "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()} "
            f"({sys.executable}); load average {load}")


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Pages/s through the Kafka service (`stream-dedup serve`) vs `replay` on "
        "the same pages, one worker vs two. Prints a table; changes nothing in the repo.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=5000, metavar="N",
                   help="pages in the set (default 5000; the corpus is cycled to reach it)")
    p.add_argument("--repeat", type=int, default=3, metavar="K",
                   help="timed passes per replay measurement; the median is reported (3)")
    p.add_argument("--kafka-repeat", type=int, metavar="K",
                   help="timed passes per service measurement (default: --repeat)")
    p.add_argument("--bootstrap", default="127.0.0.1:9092", metavar="HOST:PORT",
                   help="Kafka broker (default 127.0.0.1:9092)")
    p.add_argument("--synthetic", action="store_true",
                   help="cli/sample.py build() pages (seeds 1, 2, ...) instead of the corpus")
    p.add_argument("--corpus", default=str(CORPUS), metavar="DIR",
                   help="WARC/ARC files read in place (default ../shared/corpora/warc)")
    p.add_argument("--workers", default="1,2", metavar="LIST",
                   help="worker counts to measure, comma-separated (default 1,2)")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="serve --batch-size (default: the service's own default)")
    p.add_argument("--only", choices=["replay", "kafka"], help="measure only one mode")
    p.add_argument("--poll", type=float, default=0.02, metavar="S",
                   help="seconds between polls of the decisions topic (default 0.02)")
    p.add_argument("--timeout", type=float, default=1800, metavar="S",
                   help="give up on a service pass after S seconds (default 1800)")
    p.add_argument("--phases", action="store_true",
                   help="afterwards, one extra pass of replay and of the service (in-process) "
                   "per worker count with the time of each step of the batch loop")
    p.add_argument("--keep-topics", action="store_true",
                   help="do not delete the bench-* topics at the end")
    p.add_argument("--logs", metavar="DIR",
                   help="keep the service logs here (default: a temporary directory)")
    args = p.parse_args(argv)
    args.worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    args.kafka_repeat = args.kafka_repeat or args.repeat
    if args.pages < 1 or args.repeat < 1 or not args.worker_counts:
        p.error("--pages, --repeat and --workers must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings.load()
    run_id = uuid.uuid4().hex[:8]
    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(machine())
    print(f"settings: replay batch_size {settings.batch_size}, serve batch_size "
          f"{args.batch_size or settings.batch_size}; verify_rate {settings.verify_rate}; "
          f"run id {run_id}")
    one, ceiling = parallel_ceiling()
    print(f"parallel ceiling: 2 CPU-bound processes at once do {ceiling:.2f}x the work of one "
          f"(2.00 on two free cores; a pure-Python loop, {one:.2f} s alone)")
    Deduplicator(settings).check_html("http://warm.up/", "<p>imports and parsers warm</p>")

    with tempfile.TemporaryDirectory(prefix="stream-dedup-bench-") as tmp:
        logdir = Path(args.logs) if args.logs else Path(tmp)
        logdir.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        ps = write_page_set(args, Path(tmp) / "pages.jsonl")
        source = "synthetic (stream_dedup.cli.sample.build)" if args.synthetic else args.corpus
        print(f"page set: {ps.pages} pages from {ps.distinct_bases} base pages of {source} "
              f"(x{ps.pages / ps.distinct_bases:.2f}), bodies {ps.total_bytes / 1e6:.1f} MB "
              f"(mean {ps.total_bytes / ps.pages / 1e3:.1f} kB), JSONL {ps.message_bytes / 1e6:.1f}"
              f" MB, largest message {ps.largest_message / 1e6:.2f} MB; built in "
              f"{time.perf_counter() - t:.1f} s")
        print()

        rows: dict[tuple[str, int], Row] = {}
        replay_mix: Counter[str] | None = None
        kafka_runs: list[KafkaRun] = []
        created: list[str] = []
        phase_reports: list[tuple[str, float, dict[str, float]]] = []
        input_topic = f"bench-{run_id}-pages"

        def row(mode: str, workers: int) -> Row:
            return rows.setdefault((mode, workers), Row(mode, workers))

        try:
            if args.only != "replay":
                max_bytes = max(ps.largest_message, PRODUCE_BATCH) + 65_536  # a batch fits
                asyncio.run(create_topics(args.bootstrap, {input_topic: {
                    "max.message.bytes": str(max_bytes)}}))
                created.append(input_topic)
                secs = asyncio.run(produce(args.bootstrap, input_topic, ps.path, max_bytes))
                print(f"produced {ps.pages} pages to {input_topic} in {secs:.2f} s "
                      f"({ps.pages / secs:.0f} pages/s, {ps.message_bytes / 1e6 / secs:.0f} MB/s;"
                      " not part of the figures below)")
                tag = f"bench-{run_id}-w<W>-r<R>"
                template = serve_command(args, input_topic, f"{tag}-decisions",
                                         f"{tag}-dead-letter", f"{tag}-group", 1)
                print("service command per pass:", shlex.join(template).replace(
                    "--workers 1", "--workers <W>"), "(HTTP API on a free port)")
            rounds = max(args.repeat if args.only != "kafka" else 0,
                         args.kafka_repeat if args.only != "replay" else 0)
            for rnd in range(rounds):  # interleaved, so slow phases of a noisy host spread out
                for w in args.worker_counts:
                    if args.only != "kafka" and rnd < args.repeat:
                        one, steady, summary = replay_pass(ps.path, settings, w, ps.pages)
                        row("replay", w).passes.append(one)
                        row("replay, from first batch out", w).passes.append(steady)
                        secs = one.seconds
                        mix = Counter(summary.decisions)
                        if replay_mix is None:
                            replay_mix = mix
                        elif mix != replay_mix:
                            print(f"WARNING: replay pass {rnd + 1} w={w} decided differently")
                        print(f"[round {rnd + 1}] replay w={w}: {secs:.2f} s "
                              f"({ps.pages / secs:.1f} pages/s)", flush=True)
                    if args.only != "replay" and rnd < args.kafka_repeat:
                        tag = f"bench-{run_id}-w{w}-r{rnd + 1}"
                        run = asyncio.run(kafka_pass(args, input_topic, ps.pages, w, tag,
                                                     logdir, created))
                        kafka_runs.append(run)
                        row("kafka serve, from spawn", w).passes.append(
                            Pass(run.pages, run.total_s, run.cpu_total))
                        row("kafka serve, from first decision", w).passes.append(
                            Pass(run.steady_pages, run.steady_s, run.cpu_steady))
                        ready = f"{run.ready_s:.2f} s" if run.ready_s is not None else "?"
                        print(f"[round {rnd + 1}] kafka w={w}: {run.total_s:.2f} s from spawn "
                              f"({ps.pages / run.total_s:.1f} pages/s); connected at {ready}, "
                              f"first {run.first_count} decisions at {run.first_s:.2f} s, then "
                              f"{run.steady_pages / run.steady_s:.1f} pages/s; "
                              f"{run.batches} batches", flush=True)
            for w in args.worker_counts if args.phases else []:
                if args.only != "kafka":
                    total, ph = replay_phases(ps.path, settings, w)
                    phase_reports.append((f"replay w={w}", total, ph))
                if args.only != "replay":
                    total, ph = asyncio.run(service_phases(
                        args, input_topic, ps.pages, w, f"bench-{run_id}-w{w}-phases", created))
                    phase_reports.append((f"service w={w} (in-process)", total, ph))
        finally:
            if created and not args.keep_topics:
                try:
                    asyncio.run(delete_topics(args.bootstrap, created))
                except Exception as exc:  # cleanup must not hide the figures or the error
                    print(f"(could not delete topics {created}: {exc})", file=sys.stderr)

        print()
        order = {"replay": 0, "replay, from first batch out": 1, "kafka serve, from spawn": 2,
                 "kafka serve, from first decision": 3}
        print_table(sorted(rows.values(), key=lambda r: (order[r.mode], r.workers)))
        print()
        if replay_mix is not None:
            print_mix("decision mix (replay, every pass identical unless warned above):",
                      replay_mix, ps.pages)
        for run in kafka_runs:
            same = "same as replay" if replay_mix is None or run.mix == replay_mix else "DIFFERS"
            if replay_mix is None or run.mix != replay_mix:
                print_mix(f"decision mix (kafka w={run.workers}): {same}", run.mix, ps.pages)
        if kafka_runs and replay_mix is not None and all(r.mix == replay_mix for r in kafka_runs):
            print("every service pass produced exactly this mix as well")
        if kafka_runs:
            sizes = [r.pages / r.batches for r in kafka_runs if r.batches]
            if sizes:
                print(f"service batches: mean {statistics.mean(sizes):.0f} records per batch")
        if kafka_runs and min(r.batches or 0 for r in kafka_runs) < 10:
            print("note: under 10 service batches per pass: the 'from first decision' rows rest "
                  "on few batches; use more --pages")
        if phase_reports:
            print("\nphases (extra passes after the timed ones, each step's wall time summed):")
            for title, total, ph in phase_reports:
                print_phases(title, total, ph, ps.pages)
            print()
        one, ceiling = parallel_ceiling()
        print(f"parallel ceiling at the end: {ceiling:.2f}x; load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if args.logs:
            print(f"service logs: {logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
