#!/usr/bin/env python3
"""Fault campaign: `serve --workers 2` under SIGKILLs, malformed records and a broker outage.

A script that prints figures, not a test. In one bounded run it:

1. starts a broker of its own (deploy/kafka-local in a temporary directory; it picks free
   ports below the ephemeral range, so the broker can be restarted on the same port);
2. fills a 3-partition topic with --pages synthetic pages (stream_dedup.sample, seeds 1, 2,
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

    python bench/faults.py                     # 2000 pages, 200 malformed, 5 kills (~3 min)
    python bench/faults.py --pages 500 --malformed 40 --kills 2 --outage 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KAFKA_LOCAL = REPO / "deploy" / "kafka-local"
sys.path.insert(0, str(REPO))

from throughput import create_topics, free_port  # noqa: E402  (bench/ is sys.path[0])

from stream_dedup.sample import build  # noqa: E402

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


def kcat(bootstrap: str, topic: str, partition: int, key: bytes, value: bytes | None,
         headers: tuple[bytes, ...] = ()) -> None:
    cmd = [b"kcat", b"-P", b"-b", bootstrap.encode(), b"-t", topic.encode(),
           b"-p", str(partition).encode(), b"-K", b"\x01", b"-D", b"\x02"]
    if value is None:
        cmd.append(b"-Z")  # an empty value is sent as NULL: a tombstone
    for h in headers:
        cmd += [b"-H", h]
    subprocess.run(cmd, input=key + b"\x01" + (value or b"") + b"\x02", check=True, timeout=120)


def consume(bootstrap: str, topic: str) -> list[dict[str, object]]:
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e",
                          "-J", "-q"], capture_output=True, timeout=300)
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
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="stream-dedup-faults-"))
    print(f"# Fault campaign ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}): "
          f"{' '.join(sys.argv[1:]) or 'defaults'}; work dir {work}")
    bootstrap = broker("start", work / "kafka")
    c = Campaign()
    try:
        run(args, rng, bootstrap, work, c)
        report(args, c, bootstrap)
    finally:
        broker("stop", work / "kafka")


def run(args: argparse.Namespace, rng: random.Random, bootstrap: str, work: Path,
        c: Campaign) -> None:
    topic = c.topic = f"faults-{args.seed}-{int(time.time())}"
    asyncio.run(create_topics(bootstrap, {topic: {}}, partitions=3))
    pages = []
    seed = 1
    while len(pages) < args.pages:
        pages += build(seed=seed)
        seed += 1
    pages = pages[:args.pages]
    kinds = list(POISONS)
    poison_at = set(rng.sample(range(args.pages + args.malformed), args.malformed))
    lines: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    produced = 0
    page_iter = iter(pages)
    started = time.monotonic()
    for i in range(args.pages + args.malformed):
        part = rng.randrange(3)
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
    log = work / "serve.log"
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
             "--workers", str(args.workers), "--max-page-bytes", str(MAX_PAGE_BYTES)],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, cwd=REPO)  # noqa: SIM115
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
            elif c.kills >= args.kills and _all_decided(bootstrap, topic, c.records):
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


def _all_decided(bootstrap: str, topic: str, n: int) -> bool:
    end = subprocess.run(["kcat", "-Q", "-b", bootstrap, "-t", f"{topic}-decisions:0:-1"],
                         capture_output=True, text=True, timeout=60)
    try:
        if int(end.stdout.split()[-1]) < n:
            return False
    except (ValueError, IndexError):
        return False
    return len({_source(m) for m in consume(bootstrap, topic + "-decisions")}) >= n


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
    expected = Counter()
    for kind, n in c.malformed.items():
        expected[POISONS[kind][3]] += n
    changed = sum(len(ds) > 1 for ds in by_source.values())
    reduced = sum(1 for m in consume(bootstrap, c.topic + "-decisions")
                  if _header(m, "stream-dedup-reduced") != "None")
    sent = sum(c.malformed.values())
    kinds = ", ".join(f"{k} {rejects[k]}/{n}" for k, n in sorted(expected.items()))
    rows = [
        ("records: pages + malformed + 1 page with a 600 KB URL",
         f"{c.records} ({args.pages} + {sent} + 1)"),
        ("records without a decision", c.records - len(by_source)),
        ("self-duplicates", self_dups),
        ("dead letters (distinct records) / malformed records sent", f"{len(dead)} / {sent}"),
        ("rejects by kind, decided / sent", kinds),
        ("decisions sent reduced (larger than the topic accepts)", reduced),
        ("records whose deliveries got different decisions",
         f"{changed} (memory index: a restart forgets)"),
        ("decisions written (redeliveries included)", len(decisions)),
        (f"SIGKILLs (--workers {args.workers})", c.kills),
        ("exits on its own (restarts caused by input)", len(c.own_exits)),
        ("final SIGTERM: exit code", c.final_exit),
        ("peak RSS of the service (VmHWM, largest run)", f"{c.peak_rss_kb / 1024:.0f} MiB"),
        ("broker outage", f"{c.outage_s:.0f} s: {c.outage_log_bytes:,} bytes of service log, "
                          f"{c.outage_cpu:.1%} of a core"),
    ]
    print("\n| figure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


def _header(m: dict[str, object], name: str) -> str:
    h = list(m.get("headers") or [])  # type: ignore[call-overload]
    return str(dict(zip(h[::2], h[1::2], strict=True)).get(name))


if __name__ == "__main__":
    main()
