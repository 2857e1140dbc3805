#!/usr/bin/env python3
"""Fault campaign: `serve --workers 2` under SIGKILLs, malformed records and a broker outage.

A script that prints figures, not a test. In one bounded run it:

1. starts a broker of its own (deploy/kafka-local in a temporary directory; it picks free
   ports below the ephemeral range, so the broker can be restarted on the same port);
2. fills a 3-partition topic with --pages synthetic pages (stream_dedup.cli.sample, seeds 1, 2,
   ...) and, mixed in at seeded positions, --malformed records of every poison kind below
   (round robin), plus one page with a 600 KB URL (legal, but its decision is above the
   broker's 1 MB limit: it must be sent reduced);
3. runs the service like a supervisor would (restart whenever it exits): --kills SIGKILLs at
   seeded moments (each restart is the supervisor's, not the input's), and, after the first
   kill, one broker outage of --outage seconds (deploy/kafka-local stop, then start) while
   the service is busy; it measures the service's log bytes and CPU during the outage;
4. when every input record has a decision, SIGTERMs the service (exit code printed) and
   prints: records without a decision (must be 0), self-duplicates (a page called a
   duplicate of its own URL: 0), dead letters per malformed record sent (distinct sources,
   1.00), decisions that differ between deliveries of the same record (memory index:
   expected after a kill, see docs/reference.md), exits the service made on its own
   (restarts caused by input: 0), peak RSS of the service (VmHWM, largest over its runs),
   and the outage's log bytes and CPU.

With --exactly-once the service runs `serve --exactly-once` (Kafka transactions,
kafka/transactions.py) and every output topic is read with isolation.level=read_committed. The
figures then check what that mode promises: one decision per record (how many records have
0, 1, more), every kept page once on the kept topic (matched to its input record by key and
bytes), one dead letter per malformed record, no drop whose duplicate_of names a page that no
keep decision kept; and they count the aborted transactions (runs of decision records that
only read_uncommitted sees) and the sessions the service started over, by cause (its log).
The input order across partitions is not fixed, so only these invariants hold for 3
partitions; with --partitions 1 the decisions are also compared with an uninterrupted run:
`Deduplicator.check_batch` over the same records read back, page ids included (expected: 0
differ). --index lsm runs the service on an LSM index in the work dir.

    python bench/faults.py                     # 2000 pages, 200 malformed, 5 kills (~3 min)
    python bench/faults.py --pages 500 --malformed 40 --kills 2 --outage 10
    python bench/faults.py --exactly-once
    python bench/faults.py --exactly-once --partitions 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KAFKA_LOCAL = REPO / "deploy" / "kafka-local"
sys.path.insert(0, str(REPO))

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition  # noqa: E402
from throughput import create_topics, free_port  # noqa: E402  (bench/ is sys.path[0])

from stream_dedup import Deduplicator, Settings  # noqa: E402
from stream_dedup.cli.sample import build  # noqa: E402
from stream_dedup.kafka.batches import source_of  # noqa: E402
from stream_dedup.kafka.messages import page_from_message  # noqa: E402
from stream_dedup.kafka.tolerating import install_tolerating_reader  # noqa: E402
from stream_dedup.models import position_id  # noqa: E402

# name -> (key, value, kcat -H arguments, expected reject kind)
POISONS: dict[str, tuple[bytes, bytes | None, tuple[bytes, ...], str]] = {
    "bad-json": (b"k", b"{not json", (), "bad-json"),
    "random-bytes": (b"k", bytes(random.Random(3).randrange(256) for _ in range(2000)), (),
                     "bad-json"),
    "no-url": (b"k", b'{"html": "<p>x</p>"}', (), "no-url"),
    "bad-base64": (b"k", b'{"url": "https://m.example/b", "body_b64": "%%%"}', (), "bad-base64"),
    "bad-field": (b"k", b'{"url": "https://m.example/f", "html": "x", "status": "200"}', (),
                  "bad-field"),
    "surrogate-url": (b"k", b'{"url": "https://m.example/\\ud800", "html": "<p>x</p>"}', (),
                      "bad-url"),
    "header-key": (b"k", b'{"url": "https://m.example/h", "html": "<p>x</p>"}',
                   (b"\xff\xfekey=v",), "bad-header"),
    "tombstone": (b"k", None, (), "no-body"),
    "too-large": (b"k", json.dumps({"url": "https://m.example/big",
                                    "html": "<p>" + "x " * 400_000 + "</p>"}).encode(), (),
                  "too-large"),
}
MAX_PAGE_BYTES = 700_000  # the 600 KB URL's page fits; the too-large poison (800 KB) not


@dataclass
class Campaign:
    records: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    own_exits: list[int] = field(default_factory=list)
    peak_rss_kb: int = 0
    outage_log_bytes: int = 0
    outage_cpu: float = 0.0
    outage_s: float = 0.0
    final_exit: int | None = None
    topic: str = ""
    isolation: str = ""  # kcat's isolation.level for the outputs ("": its default)
    log: Path | None = None


def kcat(bootstrap: str, topic: str, partition: int, key: bytes, value: bytes | None,
         headers: tuple[bytes, ...] = ()) -> None:
    cmd = [b"kcat", b"-P", b"-b", bootstrap.encode(), b"-t", topic.encode(),
           b"-p", str(partition).encode(), b"-K", b"\x01", b"-D", b"\x02"]
    if value is None:
        cmd.append(b"-Z")  # an empty value is sent as NULL: a tombstone
    for h in headers:
        cmd += [b"-H", h]
    subprocess.run(cmd, input=key + b"\x01" + (value or b"") + b"\x02", check=True, timeout=120)


def consume(bootstrap: str, topic: str, isolation: str = "") -> list[dict[str, object]]:
    level = ["-X", f"isolation.level={isolation}"] if isolation else []
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e",
                          "-J", "-q", *level], capture_output=True, timeout=300)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def broker(cmd: str, directory: Path) -> str:
    done = subprocess.run([str(KAFKA_LOCAL), cmd, str(directory)], capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"kafka-local {cmd} failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1] if cmd == "start" else ""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=2000)
    ap.add_argument("--malformed", type=int, default=200)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--outage", type=float, default=20.0, help="seconds the broker is down")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--exactly-once", action="store_true",
                    help="serve --exactly-once; outputs read with read_committed")
    ap.add_argument("--partitions", type=int, default=3,
                    help="input partitions (1, with --exactly-once: decisions compared with "
                         "an uninterrupted run)")
    ap.add_argument("--index", choices=("memory", "lsm"), default="memory")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="stream-dedup-faults-"))
    print(f"# Fault campaign ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): "
          f"{' '.join(sys.argv[1:]) or 'defaults'}; work dir {work}")
    bootstrap = broker("start", work / "kafka")
    c = Campaign(isolation="read_committed" if args.exactly_once else "")
    try:
        run(args, rng, bootstrap, work, c)
        if args.exactly_once:
            report_exactly_once(args, c, bootstrap)
        else:
            report(args, c, bootstrap)
    finally:
        broker("stop", work / "kafka")


def run(args: argparse.Namespace, rng: random.Random, bootstrap: str, work: Path,
        c: Campaign) -> None:
    topic = c.topic = f"faults-{args.seed}-{int(time.time())}"
    asyncio.run(create_topics(bootstrap, {topic: {}}, partitions=args.partitions))
    pages = []
    seed = 1
    while len(pages) < args.pages:
        pages += build(seed=seed)
        seed += 1
    pages = pages[:args.pages]
    kinds = list(POISONS)
    poison_at = set(rng.sample(range(args.pages + args.malformed), args.malformed))
    lines: dict[int, list[bytes]] = {part: [] for part in range(args.partitions)}
    produced = 0
    page_iter = iter(pages)
    started = time.monotonic()
    for i in range(args.pages + args.malformed):
        part = rng.randrange(args.partitions)
        if i in poison_at:
            kind = kinds[sum(c.malformed.values()) % len(kinds)]
            key, value, headers, _ = POISONS[kind]
            kcat(bootstrap, topic, part, key, value, headers)
            c.malformed[kind] += 1
        else:
            p = next(page_iter)
            lines[part].append(p.url.encode() + b"\x01" + json.dumps(
                {"url": p.url, "html": p.html}).encode() + b"\x02")
        produced += 1
    for part, batch in lines.items():
        subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-p", str(part), "-K",
                        "\x01", "-D", "\x02"], input=b"".join(batch), check=True, timeout=300)
    long_url = "https://m.example/" + "a" * 600_000
    kcat(bootstrap, topic, 0, b"long", json.dumps({"url": long_url, "html": pages[0].html
                                                   + "<p>long url</p>"}).encode())
    c.records = produced + 1
    print(f"produced {c.records} records ({sum(c.malformed.values())} malformed) in "
          f"{time.monotonic() - started:.0f} s")

    port = free_port()
    log = c.log = work / "serve.log"
    # This checkout's code in the service and the processes it starts, whichever checkout
    # the package is installed from.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    mode = ["--exactly-once"] if args.exactly_once else []
    if args.index == "lsm":
        mode += ["--index", "lsm", "--index-path", str(work / "index")]
    # Kill points and the outage, in pages decided by the run in progress (seeded).
    kill_after = [rng.randrange(20, 300) for _ in range(args.kills)]
    outage_after = rng.randrange(20, 100)
    outage_done = False
    while True:
        size0 = log.stat().st_size if log.exists() else 0
        proc = subprocess.Popen(
            [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers", bootstrap,
             "--input-topic", topic, "--decisions-topic", topic + "-decisions",
             "--kept-topic", topic + "-kept", "--dead-letter-topic", topic + "-dead",
             "--group-id", topic + "-group", "--http-port", str(port), "--batch-size", "100",
             "--workers", str(args.workers), "--max-page-bytes", str(MAX_PAGE_BYTES), *mode],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=REPO, env=env)  # noqa: SIM115
        killed = False
        while proc.poll() is None:
            time.sleep(0.1)
            c.peak_rss_kb = max(c.peak_rss_kb, peak_rss_kb(proc.pid))
            decided = _decided(port)
            if c.kills == 1 and not outage_done and decided >= outage_after:
                outage_done = True
                outage(work, proc, log, args.outage, c)
            elif c.kills < args.kills and decided >= kill_after[c.kills]:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                c.kills += 1
                killed = True
            elif c.kills >= args.kills and _all_decided(bootstrap, topic, c.records,
                                                        c.isolation):
                proc.send_signal(signal.SIGTERM)
                c.final_exit = proc.wait(timeout=60)
                return
        if not killed:
            c.own_exits.append(proc.returncode)
            print(f"the service exited on its own with {proc.returncode}; log:\n"
                  + log.read_bytes()[size0:][-3000:].decode(errors="replace"))
            if len(c.own_exits) > 3:
                return


def outage(work: Path, proc: subprocess.Popen[bytes], log: Path, seconds: float,
           c: Campaign) -> None:
    broker("stop", work / "kafka")
    size0, cpu0, t0 = log.stat().st_size, cpu_seconds(proc.pid), time.monotonic()
    while time.monotonic() - t0 < seconds and proc.poll() is None:
        time.sleep(0.5)
    c.outage_s = time.monotonic() - t0
    if proc.poll() is None:
        c.outage_cpu = (cpu_seconds(proc.pid) - cpu0) / c.outage_s
    c.outage_log_bytes = log.stat().st_size - size0
    broker("start", work / "kafka")


def _decided(port: int) -> int:
    """Pages this run of the service has decided (its /metrics), 0 before it answers."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return 0
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("stream_dedup_pages_total{")))


def _all_decided(bootstrap: str, topic: str, n: int, isolation: str) -> bool:
    end = subprocess.run(["kcat", "-Q", "-b", bootstrap, "-t", f"{topic}-decisions:0:-1"],
                         capture_output=True, text=True, timeout=60)
    try:
        if int(end.stdout.split()[-1]) < n:
            return False
    except (ValueError, IndexError):
        return False
    return len({_source(m) for m in consume(bootstrap, topic + "-decisions", isolation)}) >= n


def _source(m: dict[str, object]) -> str:
    return str(json.loads(str(m["payload"]))["source"])


def report(args: argparse.Namespace, c: Campaign, bootstrap: str) -> None:
    decisions = [json.loads(str(m["payload"])) for m in consume(bootstrap, c.topic + "-decisions")]
    by_source: dict[str, set[tuple[str, str]]] = {}
    for d in decisions:
        by_source.setdefault(d["source"], set()).add((d["decision"], d["reason"]))
    self_dups = sum(1 for d in decisions if d["duplicate_of"]
                    and d["duplicate_of"]["url"] == d["url"])
    dead = {_header(m, "stream-dedup-source") for m in consume(bootstrap, c.topic + "-dead")}
    rejects = Counter(r for ds in by_source.values() for k, r in ds if k == "reject")
    changed = sum(len(ds) > 1 for ds in by_source.values())
    reduced = sum(1 for m in consume(bootstrap, c.topic + "-decisions")
                  if _header(m, "stream-dedup-reduced") != "None")
    sent = sum(c.malformed.values())
    rows: list[tuple[str, object]] = [
        ("records: pages + malformed + 1 page with a 600 KB URL",
         f"{c.records} ({args.pages} + {sent} + 1)"),
        ("records without a decision", c.records - len(by_source)),
        ("self-duplicates", self_dups),
        ("dead letters (distinct records) / malformed records sent", f"{len(dead)} / {sent}"),
        ("rejects by kind, decided / sent", _rejects_by_kind(c, rejects)),
        ("decisions sent reduced (larger than the topic accepts)", reduced),
        ("records whose deliveries got different decisions",
         f"{changed} (memory index: a restart forgets)"),
        ("decisions written (redeliveries included)", len(decisions)),
        *_run_rows(args, c),
    ]
    _table(rows)


def _rejects_by_kind(c: Campaign, rejects: Counter[str]) -> str:
    expected: Counter[str] = Counter()
    for kind, n in c.malformed.items():
        expected[POISONS[kind][3]] += n
    return ", ".join(f"{k} {rejects[k]}/{n}" for k, n in sorted(expected.items()))


def _run_rows(args: argparse.Namespace, c: Campaign) -> list[tuple[str, object]]:
    """What happened to the service: kills, its own exits, memory, the outage."""
    return [
        (f"SIGKILLs (--workers {args.workers})", c.kills),
        ("exits on its own (restarts caused by input)", len(c.own_exits)),
        ("final SIGTERM: exit code", c.final_exit),
        ("peak RSS of the service (VmHWM, largest run)", f"{c.peak_rss_kb / 1024:.0f} MiB"),
        ("broker outage", f"{c.outage_s:.0f} s: {c.outage_log_bytes:,} bytes of service log, "
                          f"{c.outage_cpu:.1%} of a core"),
    ]


def _table(rows: list[tuple[str, object]]) -> None:
    print("\n| figure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


def _header(m: dict[str, object], name: str) -> str:
    h = list(m.get("headers") or [])  # type: ignore[call-overload]
    return str(dict(zip(h[::2], h[1::2], strict=True)).get(name))


# --- --exactly-once ---------------------------------------------------------------------
def report_exactly_once(args: argparse.Namespace, c: Campaign, bootstrap: str) -> None:
    """The figures of `serve --exactly-once`, every output read with read_committed."""
    records = asyncio.run(read_input(bootstrap, c.topic, args.partitions))
    sources = [source_of(r.topic, r.partition, r.offset) for r in records]
    committed = consume(bootstrap, c.topic + "-decisions", "read_committed")
    everything = consume(bootstrap, c.topic + "-decisions", "read_uncommitted")
    decisions = [json.loads(str(m["payload"])) for m in committed]
    per_record: dict[str, list[tuple[str, str]]] = {}
    for d in decisions:
        per_record.setdefault(d["source"], []).append((d["decision"], d["reason"]))
    spread = Counter(min(len(per_record.get(s, ())), 2) for s in sources)
    differing = sum(len(set(ds)) > 1 for ds in per_record.values())
    # A transaction's decision records are consecutive and its marker takes the offset
    # after them: each run of offsets read_uncommitted alone sees is one aborted transaction.
    aborted = {int(str(m["offset"])) for m in everything} - {
        int(str(m["offset"])) for m in committed}
    aborted_runs = sum(o - 1 not in aborted for o in aborted)
    known = set(sources)
    unknown = sum(len(ds) for s, ds in per_record.items() if s not in known)

    keeps = {d["source"]: d for d in decisions if d["decision"] == "keep"}
    kept_ids = {d["page_id"] for d in keeps.values()}
    never_kept = [d for d in decisions
                  if d["duplicate_of"] and d["duplicate_of"]["page_id"] not in kept_ids]
    self_dups = sum(1 for d in decisions if d["duplicate_of"]
                    and d["duplicate_of"]["url"] == d["url"])
    on_kept, strays = _kept_sources(consume(bootstrap, c.topic + "-kept", "read_committed"),
                                    records)
    kept_records = sum(on_kept.values()) + strays
    missing = sum(1 for s in keeps if on_kept[s] == 0)
    repeats = sum(n - 1 for n in on_kept.values() if n > 1)
    not_kept = sum(n for s, n in on_kept.items() if s not in keeps) + strays

    dead = Counter(_header(m, "stream-dedup-source")
                   for m in consume(bootstrap, c.topic + "-dead", "read_committed"))
    rejects = Counter(r for ds in per_record.values() for k, r in set(ds) if k == "reject")
    reduced = sum(1 for m in committed if _header(m, "stream-dedup-reduced") != "None")
    sent = sum(c.malformed.values())
    logged = _service_log(c.log)

    rows: list[tuple[str, object]] = [
        ("records: pages + malformed + 1 page with a 600 KB URL",
         f"{c.records} ({args.pages} + {sent} + 1) in {args.partitions} partition(s); read "
         f"back: {len(records)}"),
        ("records without a decision", spread[0]),
        ("records with 0 / 1 / more than 1 decision",
         f"{spread[0]} / {spread[1]} / {spread[2]}"),
        ("records whose decisions differ from each other", differing),
        ("decisions naming no input record", unknown),
        ("decisions written (read_committed)", len(decisions)),
        ("aborted transactions (with decisions) / their decision records (read_uncommitted "
         "only)", f"{aborted_runs} / {len(aborted)}"),
        ("kept topic: records / keep decisions", f"{kept_records} / {len(keeps)}"),
        ("kept topic: keeps missing / a keep's page again / no keep's page",
         f"{missing} / {repeats} / {not_kept}"),
        ("drops naming a page that was never kept (duplicate_of.page_id)", len(never_kept)),
        ("self-duplicates", self_dups),
        ("dead letters: records / distinct records / malformed records sent",
         f"{sum(dead.values())} / {len(dead)} / {sent}"),
        ("rejects by kind, decided / sent", _rejects_by_kind(c, rejects)),
        ("decisions sent reduced (larger than the topic accepts)", reduced),
    ]
    if args.partitions == 1:
        differ, compared, example = _against_uninterrupted(records, decisions, committed)
        rows.append(("decisions that differ from an uninterrupted run "
                     "(Deduplicator over the same records)", f"{differ} of {compared}"))
        if example:
            print(f"first difference: {example}")
    rows += [
        ("sessions started over (log: \"starting over from the last commit\"), by cause",
         f"{sum(logged['over'].values())} ("
         + (", ".join(f"{why}: {n}" for why, n in logged["over"].most_common()) or "none")
         + ")"),
        ("index restored at start: runs / kept pages claimed again",
         f"{logged['restores']} / {logged['restored']}"),
        ("service log: ERROR lines / tracebacks",
         f"{logged['errors']} / {logged['tracebacks']}"),
        *_run_rows(args, c),
    ]
    _table(rows)


async def read_input(bootstrap: str, topic: str, partitions: int) -> list[ConsumerRecord]:
    """Every record of the input topic with its bytes, by partition and offset. The
    service's tolerant reader: a header key that is not UTF-8 stops aiokafka's own."""
    install_tolerating_reader()
    # Its warning about each such record is the service's to give, not ours.
    logging.getLogger("stream_dedup.kafka").setLevel(logging.ERROR)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                max_partition_fetch_bytes=2 * 1024 * 1024)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        end = await consumer.end_offsets(tps)
        out: list[ConsumerRecord] = []
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            for batch in (await consumer.getmany(timeout_ms=1000)).values():
                out += batch
    finally:
        await consumer.stop()
    return sorted(out, key=lambda r: (r.partition, r.offset))


def _kept_sources(kept: list[dict[str, object]], records: list[ConsumerRecord],
                  ) -> tuple[Counter[str], int]:
    """Each kept-topic record's input record (a copy has the input's key and value, a
    reference names it in stream-dedup-ref): how often each source is there, and how many
    kept-topic records match no input record, or several."""
    by_bytes: dict[tuple[bytes | None, bytes | None], list[str]] = {}
    for r in records:
        by_bytes.setdefault((r.key, r.value), []).append(
            source_of(r.topic, r.partition, r.offset))
    on_kept: Counter[str] = Counter()
    strays = 0
    for m in kept:
        ref = _header(m, "stream-dedup-ref")
        if ref != "None":
            on_kept[ref] += 1
            continue
        key, value = m.get("key"), m.get("payload")
        matches = by_bytes.get((None if key is None else str(key).encode(),
                                None if value is None else str(value).encode()), [])
        if len(matches) == 1:
            on_kept[matches[0]] += 1
        else:
            strays += 1
    return on_kept, strays


def _against_uninterrupted(records: list[ConsumerRecord], decisions: list[dict[str, Any]],
                           committed: list[dict[str, object]]) -> tuple[int, int, str]:
    """The service's decision of every record against the one an uninterrupted run gives:
    `Deduplicator.check_batch` over the same records (pages made from them as the service
    makes them, page ids included), in their order. A decision the service sent reduced
    (clipped URLs) is compared by decision, reason, page id and duplicate's page id; the
    others field by field. How many differ, how many were compared, the first difference."""
    reference = Deduplicator(Settings(max_page_bytes=MAX_PAGE_BYTES))
    items = [page_from_message(r.value, r.key, list(r.headers or ()),
                               source_of(r.topic, r.partition, r.offset), input_format="json",
                               max_bytes=MAX_PAGE_BYTES,
                               position=position_id(r.timestamp, r.partition, r.offset))
             for r in records]
    expected: list[dict[str, Any]] = []
    for i in range(0, len(items), 100):
        expected += [d.to_dict() for d in reference.check_batch(items[i:i + 100])]
    got: dict[str, list[tuple[dict[str, Any], bool]]] = {}
    for d, m in zip(decisions, committed, strict=True):
        got.setdefault(d["source"], []).append((d, _header(m, "stream-dedup-reduced") != "None"))

    def gist(d: dict[str, Any]) -> tuple[Any, ...]:
        dup = d["duplicate_of"]
        return d["decision"], d["reason"], d["page_id"], dup and dup["page_id"]

    differ, first = 0, ""
    for e in expected:
        wrong = [d for d, reduced in got.get(e["source"], [])
                 if (gist(d) != gist(e) if reduced else d != e)]
        if wrong or e["source"] not in got:
            differ += 1  # a record counts once, whatever number of its decisions differ
            if not first:
                d = wrong[0] if wrong else None
                fields = sorted(k for k in e if d is None or d.get(k) != e[k])
                first = (f"{e['source']}: " + ", ".join(
                    f"{k} {None if d is None else d.get(k)!r:.80} vs {e[k]!r:.80}"
                    for k in fields))
    return differ, len(expected), first


def _service_log(log: Path | None) -> dict[str, Any]:
    text = log.read_text(errors="replace") if log is not None and log.exists() else ""
    lines = text.splitlines()
    # "no producer for <partition>: ..." or "the transaction of <partition> did not commit
    # (<error>: ...)", each followed by "; starting over from the last commit".
    over: Counter[str] = Counter()
    for why in re.findall(r"stream_dedup\.service: (.*?); starting over from the last commit",
                          text):
        error = re.search(r"did not commit \((\w+)", why)
        over["no producer for the partition" if why.startswith("no producer")
             else f"did not commit, {error.group(1)}" if error else why[:60]] += 1
    return {
        "over": over,
        "restores": sum(bool(re.search(r"restored \d+ kept pages", line)) for line in lines),
        "restored": sum(int(m) for m in re.findall(r"restored (\d+) kept pages", text)),
        "errors": sum(" ERROR " in line for line in lines),
        "tracebacks": text.count("Traceback (most recent call last)"),
    }


if __name__ == "__main__":
    main()
