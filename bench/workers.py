#!/usr/bin/env python3
"""`replay --workers W` against `--workers 1`, in one run: what more cores buy.

Each round runs `python -m stream_dedup replay FILES --workers W -o /dev/null` as a fresh
process for W = 1 .. --max-workers (default: the cores this process may use), the order
turned around every other round, on each input:
- corpora: every WARC/ARC file of ../shared/corpora/warc, then the httpbis drafts (written
  once to a temporary JSONL, raw bytes in `body_b64`);
- synthetic: `benchlib.synthetic_pages(--pages)` (20 KB pages, 15 % near-duplicates), JSONL;
- small: one WARC file (--small), the case that must not get slower with a pool;
- big: one record-gzipped WARC of --big-mb (62) MB built in a temporary directory by
  bench/bigwarc.py, the issue's file: the corpus's HTML responses again and again, URLs made
  distinct, so from the second round on every body is an exact copy (mostly reading);
- big-distinct: the same with each round's text shifted so that it is new text (analysis
  as for new pages).
Two figures a run: `replay` = the replay call as the summary reports it (reading, deciding,
writing, the analysis processes' start and stop: start-up of the pool included), and
`process` = the whole command, interpreter start and imports included (from cached bytecode,
as an installed package has it: one untimed run of each checkout first). Pages/s are from the
median of --rounds; the W/1 ratio is the ratio of the medians (the per-round ratios' median
is printed too). CPU W/1: the CPU seconds (user + system, workers included) of W processes
against one: the work that splitting adds, steadier than wall time on a shared host.
--one-cpu also times `--workers 1` under `taskset -c` (the first CPU this process may use):
a lone replay is not placed (stream_dedup/workers/cpus.py), so this is how much a CPU of its own
would give it, and `--workers 2` against that is the ratio with no placement on one side.
--pair also times two `--workers 1` replays of the input at once, each under taskset on a
CPU of its own: against one alone on one CPU, what a second process gets done on this work
on this host. Two CPU-bound loops (`host` below) share little but the CPUs; two replays also
share caches and memory, and no split of one input in two processes can do better than
two independent replays of it.

Bounds, measured in this process:
- decide ceiling: pages/s of `Deduplicator.check_batch` (batches of 500) when every analysis
  is precomputed (an AnalysisPool whose `analyse` looks them up): the ordered, single-threaded
  part, which bounds what any number of analysis processes can reach;
- replay ceiling: the same replay (runner, reading, writing) with analysis free;
- host: two CPU-bound processes against one (2.0 on two free cores): on a shared machine
  the most that any second process can add at the time of the run.

What bounds `--workers 2` on one file: both processes are busy to the end, so a run does at
most what two independent replays of it do at once (--pair), divided by the CPU the two
spend against one. That extra CPU: the worker fills a heap of its own and both copy the
pages they write after the fork (page faults), the replay process's threads (deciding,
reading units, the pool's result thread) hand the GIL to each other, and the results are
pickled and unpacked. On the synthetic crawl the worker also computes the WARC digest of
every body that came without one, and each page's analysis goes back with its shingles
(containment needs them).

    python bench/workers.py                     # 5 rounds, all inputs, W = 1..cores (~7 min)
    python bench/workers.py --rounds 3 --pages 4000 --inputs corpora,small
    python bench/workers.py --inputs big,big-distinct --max-workers 3
    python bench/workers.py --inputs big --max-workers 2 --pair --rounds 15
"""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import benchlib
import bigwarc
from benchlib import REPO, header, parallel_ceiling, table

from stream_dedup.config import Settings
from stream_dedup.decide.verdicts import Analysis
from stream_dedup.models import Page
from stream_dedup.pipeline.analysis import AnalysisPool, Analyzer
from stream_dedup.pipeline.deduplicator import Deduplicator, raw_fingerprint
from stream_dedup.replay.run import replay
from stream_dedup.sinks.files import JsonlSink
from stream_dedup.sources.files import iter_inputs
from stream_dedup.workers.cpus import allowed

SMALL_DEFAULT = "copycat/commoncrawl-small-sample-1213893279526_0.arc"
ONE_CPU = "1, one CPU"  # --one-cpu: --workers 1 under taskset
PAIR = "1+1, a CPU each"  # --pair: two --workers 1 at once, each under taskset


def write_jsonl(pages: Sequence[Page], path: Path) -> Path:
    with open(path, "w") as fh:
        for p in pages:
            fh.write(json.dumps({"url": p.url, "body_b64": base64.b64encode(p.body).decode(),
                                 "headers": [list(h) for h in p.headers]}) + "\n")
    return path


def _replay_cmd(files: Sequence[Path], workers: int, batch_size: int, summary: str,
                extra: Sequence[str] = (), cpu: int | None = None) -> list[str]:
    return [*(["taskset", "-c", str(cpu)] if cpu is not None else []),
            sys.executable, "-m", "stream_dedup", "replay", *map(str, files), "--workers",
            str(workers), "--batch-size", str(batch_size), "-o", os.devnull, "-q",
            "--summary-json", summary, *extra]


def _env(code: Path) -> dict[str, str]:
    # From cached bytecode, as an installed package runs (main() makes the cache once):
    # without it the package is compiled at every start, before any work.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(code)
    return env


def run_replay(files: Sequence[Path], workers: int, batch_size: int, code: Path = REPO,
               extra: Sequence[str] = (), cpu: int | None = None
               ) -> tuple[float, float, int, float]:
    """(replay seconds from the summary, whole process seconds, pages, CPU seconds of the
    process and its workers) of the package in `code` (a checkout); `extra`: more options;
    `cpu`: the process runs on that CPU only (taskset)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as summary:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        # From within the checkout: `python -m` puts the working directory first on the
        # path, so from another checkout's root that checkout's code would run instead.
        subprocess.run(_replay_cmd(files, workers, batch_size, summary.name, extra, cpu),
                       check=True, env=_env(code), stdout=subprocess.DEVNULL, cwd=code)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        s = json.loads(Path(summary.name).read_text())
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return s["seconds"], wall, s["pages"], cpu_s


def run_pair(files: Sequence[Path], batch_size: int, cpus: Sequence[int],
             code: Path = REPO) -> tuple[float, float, int, float]:
    """Two `--workers 1` replays of `files` at once, each on a CPU of its own: as
    run_replay, the seconds of the slower one and the CPU seconds of both. Against one such
    replay alone, the most that two processes get done here on this input: what the host
    gives a second process on this work (caches, memory, the hypervisor), which bounds any
    split of one input in two."""
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        procs = [subprocess.Popen(
            _replay_cmd(files, 1, batch_size, f"{tmp}/{cpu}.json", cpu=cpu), env=_env(code),
            stdout=subprocess.DEVNULL, cwd=code) for cpu in cpus]
        cpu_s = 0.0
        try:
            for p in procs:
                _, status, usage = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)
                if p.returncode:
                    raise subprocess.CalledProcessError(p.returncode, p.args)
                cpu_s += usage.ru_utime + usage.ru_stime
        finally:  # one failed: the other is not left running
            for p in procs:
                if p.returncode is None:
                    p.kill()
                    p.wait()
        wall = time.perf_counter() - started
        runs = [json.loads(Path(f"{tmp}/{cpu}.json").read_text()) for cpu in cpus]
    return max(r["seconds"] for r in runs), wall, runs[0]["pages"], cpu_s


class Precomputed(AnalysisPool):
    """Analysis for free: every page's analysis computed beforehand, looked up by body."""

    def __init__(self, settings: Settings, analyses: dict[int, Analysis]) -> None:
        super().__init__(settings, 2)
        self.analyses = analyses

    def start(self) -> None:  # no processes
        pass

    def analyse(self, analyzer: Analyzer, pages: list[Page]) -> list[Analysis]:
        return [self.analyses[raw_fingerprint(p.body)] for p in pages]


def precompute(settings: Settings, files: Sequence[Path]) -> tuple[list[Page], Precomputed]:
    pages = [p for p in iter_inputs(files) if isinstance(p, Page)]
    analyzer = Analyzer(settings)
    analyses: dict[int, Analysis] = {}
    for p in pages:
        fp = raw_fingerprint(p.body)
        if fp not in analyses:
            analyses[fp] = analyzer.analyze(p)
    return pages, Precomputed(settings, analyses)


def decide_ceiling(settings: Settings, pages: list[Page], free: Precomputed,
                   batch: int) -> float:
    """Pages/s of check_batch when analysis costs nothing (best of 3)."""
    best = float("inf")
    for _ in range(3):
        dedup = Deduplicator(settings)
        started = time.perf_counter()
        for i in range(0, len(pages), batch):
            dedup.check_batch(pages[i:i + batch], free)
        best = min(best, time.perf_counter() - started)
        dedup.close()
    return len(pages) / best


def replay_ceiling(settings: Settings, files: Sequence[Path], free: Precomputed) -> float:
    """Pages/s of the replay call (runner, reading, writing) when analysis costs nothing,
    all in this process: the FileSource path (reading here), not the worker-read units of
    a large replay, whose readers would then analyse for real."""
    import stream_dedup.replay.run as replay_module

    best = float("inf")
    pages = 0
    made, early = replay_module.AnalysisPool, replay_module.EARLY_START_BYTES
    replay_module.AnalysisPool = lambda s, w: free  # type: ignore[assignment,misc,return-value]
    replay_module.EARLY_START_BYTES = 1 << 62
    try:
        for _ in range(3):
            started = time.perf_counter()
            pages = replay(list(files), JsonlSink(os.devnull), settings, workers=2).pages
            best = min(best, time.perf_counter() - started)
    finally:
        replay_module.AnalysisPool = made  # type: ignore[misc]
        replay_module.EARLY_START_BYTES = early
    return pages / best


def median_ratio(one: list[float], two: list[float]) -> float:
    return statistics.median(a / b for a, b in zip(one, two, strict=True))


def cpu_seconds() -> tuple[float, float, float]:
    """(CPU seconds busy on this machine, of which this process and its children, stolen by
    the hypervisor), all CPUs, from /proc/stat and getrusage."""
    mine = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))
    try:
        with open("/proc/stat") as fh:
            user, nice, system, _idle, _io, irq, softirq, steal = map(
                int, fh.readline().split()[1:9])
    except (OSError, ValueError):
        return float("nan"), mine, float("nan")
    tick = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / tick, mine, steal / tick


def cores() -> int:
    return len(allowed()) or os.cpu_count() or 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pages", type=int, default=10_000, help="synthetic pages")
    ap.add_argument("--inputs", default="corpora,synthetic,small,big,big-distinct")
    ap.add_argument("--big-mb", type=float, default=62, help="size of the built WARC files")
    ap.add_argument("--max-workers", type=int, default=cores(),
                    help="time --workers 1..this (default: the cores this process may use)")
    ap.add_argument("--small", default=SMALL_DEFAULT, help="one file under corpora/warc")
    ap.add_argument("--batch-size", type=int, default=Settings().batch_size)
    ap.add_argument("--before", type=Path, metavar="CHECKOUT",
                    help="also time this checkout (its extension built in place), same rounds")
    ap.add_argument("--one-cpu", action="store_true",
                    help="also time --workers 1 on one CPU (taskset -c, the first this process "
                    "may use): its threads kept together, as --workers N keeps each process "
                    "on a CPU of its own when they fill the CPUs")
    ap.add_argument("--pair", action="store_true",
                    help="also time two --workers 1 replays of the input at once, each on a "
                    "CPU of its own (implies --one-cpu): what a second process gets done on "
                    "this host on this work, the bound of --workers 2 on it")
    args = ap.parse_args()
    print(header("## --workers W against --workers 1 (bench/workers.py)"))
    tmp = Path(tempfile.mkdtemp(prefix="workers-bench-"))
    atexit.register(shutil.rmtree, tmp, True)  # the built WARC files: ~130 MB
    inputs: dict[str, list[Path]] = {}
    wanted = args.inputs.split(",")
    if "corpora" in wanted:
        httpbis = write_jsonl(benchlib.load_httpbis_pages(), tmp / "httpbis.jsonl")
        inputs["corpora"] = [*benchlib.warc_files(), httpbis]
    if "synthetic" in wanted:
        inputs["synthetic"] = [write_jsonl(benchlib.synthetic_pages(args.pages),
                                           tmp / "synthetic.jsonl")]
    if "small" in wanted:
        inputs["small"] = [benchlib.WARCS / args.small]
    for name, distinct in (("big", False), ("big-distinct", True)):
        if name in wanted:
            path = tmp / f"{name}.warc.gz"
            rounds, records = bigwarc.write(path, int(args.big_mb * 1e6), distinct)
            print(f"{name}: {path.stat().st_size / 1e6:.1f} MB, {records:,} HTML responses "
                  f"({rounds} rounds of the corpus's), one gzip member each")
            inputs[name] = [path]
    one, two = parallel_ceiling()
    print(f"host: one CPU-bound process {one:.2f} s; two at once do {two:.2f}x the work of "
          f"one (2.00 on two free cores)")
    busy0, mine0, steal0 = cpu_seconds()
    started = time.perf_counter()

    codes = {"this": REPO, **({"before": args.before.resolve()} if args.before else {})}
    counts: list[int | str] = list(range(1, max(args.max_workers, 2) + 1))
    cpus = sorted(allowed()) or [0]
    if args.pair and len(cpus) < 2:
        ap.error("--pair needs two CPUs this process may use")
    if args.one_cpu or args.pair:
        counts.append(ONE_CPU)
    if args.pair:
        counts.append(PAIR)

    def timed(files: list[Path], w: int | str, code: Path) -> tuple[float, float, int, float]:
        if w == PAIR:
            return run_pair(files, args.batch_size, cpus[:2], code)
        return run_replay(files, 1 if w == ONE_CPU else int(w), args.batch_size, code,
                          cpu=cpus[0] if w == ONE_CPU else None)

    for path in codes.values():  # untimed: writes each checkout's bytecode cache
        run_replay([benchlib.WARCS / args.small], 2, args.batch_size, path)
    got: dict[tuple[str, str, int | str], list[tuple[float, float, int, float]]] = {}
    for r in range(args.rounds):
        for name, files in inputs.items():
            for code, path in codes.items():
                for w in (counts if r % 2 == 0 else counts[::-1]):
                    got.setdefault((name, code, w), []).append(timed(files, w, path))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    busy, mine, steal = (b - a for a, b in zip((busy0, mine0, steal0), cpu_seconds(),
                                                  strict=True))
    spent = time.perf_counter() - started
    _, after = parallel_ceiling()
    print(f"host after the rounds: two at once do {after:.2f}x. During the {spent:.0f} s of "
          f"rounds, other processes here used {busy - mine:.1f} s of CPU "
          f"({(busy - mine) / spent:.0%} of a core) and the hypervisor took {steal:.1f} s\n")

    s = Settings()
    ceilings: dict[str, tuple[float, float]] = {}
    for name, files in inputs.items():
        if name != "small":
            pages, free = precompute(s, files)
            ceilings[name] = (decide_ceiling(s, pages, free, args.batch_size),
                              replay_ceiling(s, files, free))
            del pages, free

    rows = []
    for name in inputs:
        for code in codes:
            runs1 = got[(name, code, 1)]
            pages = runs1[0][2]
            decide = ceilings[name][0] if name in ceilings else float("nan")
            for k, label in ((0, "replay"), (1, "process")):
                s1 = [x[k] for x in runs1]
                m1 = statistics.median(s1)
                cpu1 = statistics.median(x[3] for x in runs1)
                for w in counts:
                    sw = [x[k] for x in got[(name, code, w)]]
                    mw = statistics.median(sw)
                    cpu = statistics.median(x[3] for x in got[(name, code, w)])
                    rows.append([name, code, label, pages, w, mw, pages / mw, m1 / mw,
                                 median_ratio(s1, sw), f"{min(sw):.2f}-{max(sw):.2f}",
                                 cpu, cpu / cpu1, decide])
    print(table(["input", "code", "timed", "pages", "W", "s", "pages/s", "W/1 (medians)",
                 "W/1 (rounds)", "range s", "CPU s", "CPU W/1", "decide ceiling pages/s"],
                rows))
    for name in inputs if ONE_CPU in counts else ():
        for code in codes:
            s1, s2 = ([x[0] for x in got[(name, code, w)]] for w in (ONE_CPU, 2))
            two = statistics.median(s1) / statistics.median(s2)
            print(f"{name} ({code}): replay --workers 2 / --workers 1 on one CPU: "
                  f"{two:.2f}x (rounds {median_ratio(s1, s2):.2f})")
            if PAIR in counts:
                pair = [x[0] for x in got[(name, code, PAIR)]]
                host = 2 * statistics.median(s1) / statistics.median(pair)
                print(f"  two --workers 1 at once, a CPU each, do {host:.2f}x the pages of "
                      f"one alone (rounds {2 * median_ratio(s1, pair):.2f}): --workers 2 "
                      f"gets {two / host:.0%} of what two processes get done here")
    print("\n(CPU: user + system of the whole process and its workers, medians. Where the "
          "processes are busy to the end, W/1 is at most the host's figure divided by "
          "CPU W/1: the work more processes add. The row of W = '1+1': the slower of two "
          "--workers 1 at once, the pages of one; its W/1 is half the pages they do)")
    print()
    print(table(["input", "decide ceiling pages/s", "replay ceiling pages/s"],
                [[name, *c] for name, c in ceilings.items()]))
    print("\n(ceilings: analysis precomputed, in this process; `decide` = check_batch alone: "
          "the deciding thread, which bounds any --workers; `replay` = the same replay call "
          "with reading and writing here, as a replay under 16 MB reads: a replay the "
          "workers read is not bound by it)")




if __name__ == "__main__":
    main()
