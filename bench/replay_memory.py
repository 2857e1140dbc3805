#!/usr/bin/env python3
"""What a machine running `replay` is sized by (issue 29): the whole process's peak RSS, and
its RSS at the end, as growth per page held, with the default settings.

Each run is the real CLI in a child process, `python3 -P -m stream_dedup replay CRAWL -o
/dev/null -q --summary-json S` (memory index, records on disk, every flag at its default),
with PYTHONPATH set to the checkout measured. Per run:

- peak: the child's VmHWM, the whole process's high-water mark from its exec on (the
  summary's `memory.peak_rss`, taken when the last batch was committed, or the last VmHWM
  sampled here if larger). Not `ru_maxrss`: Linux carries the parent's resident set at the
  fork into it (a bench process of 172 MiB made every small replay's peak 172 MiB);
- steady: its VmRSS when the last batch was committed with the index still held (the
  replay summary's `memory.rss`);
- pages held: the summary's `index.pages` (kept pages the index holds);
- a sample of VmRSS and VmHWM every 50 ms from here, to say when the peak came (share of
  the run);
- wall and CPU seconds (user + system of the child), and the CPU other processes used
  meanwhile (the machine's busy time from /proc/stat minus the child's), in cores.

Growth per page held is a slope against the smallest size (the base):
(peak(N) - peak(base)) / (held(N) - held(base)), and the same for steady, so the
interpreter, the modules and the tokenizer tables cancel out.

The synthetic crawl is a JSONL file written at run time (in --tmp, deleted after; `replay`
reads regular files, not pipes): page i is `{"url": "https://site-<i % 5000>.example.com/
a/<i>", "html": "<html><head><title>..</title></head><body><p>64 words</p></body></html>"}`,
its 64 words drawn uniformly from a 4,096-word vocabulary (seeded): ~520 bytes of JSON,
~420 of HTML, 57 shingles of 8 words, so every page has its 6 features, 5 band keys and 4
stored containment keys (>= 25 shingles) and nearly every page is distinct and kept. The record
file (sketch, shingle set, LD signature: ~600 bytes a page here) is on disk, not in RSS.

`--before CHECKOUT` measures an older checkout too, the two alternated at each size (A B,
B A, ...), and prints the wall and CPU ratios.

Reading the figures: the index's merges are done a step at a time, so the peak is the
steady state plus one step. The synthetic URLs (~38 characters) are shorter than real ones
(WARC mean ~61), which would add ~23 B a page to both figures.

    python bench/replay_memory.py                          # 300K, 1M (base 50K)
    python bench/replay_memory.py --pages 50000 300000 1000000 10000000
    python bench/replay_memory.py --pages 50000 300000 --rounds 3 --before /work/main
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from benchlib import table  # noqa: E402

HERE = Path(__file__).resolve().parent.parent
WORDS = 64
VOCABULARY = 4096
_SYLLABLES = "ka lo mi re su ta ne po vi da ze ru fo gi ha ly me no pa qu si to wu xe yo".split()


def vocabulary(rng: np.random.Generator) -> list[str]:
    words: set[str] = set()
    out: list[str] = []
    while len(out) < VOCABULARY:
        w = "".join(_SYLLABLES[i] for i in rng.integers(0, len(_SYLLABLES), rng.integers(2, 5)))
        if w not in words:
            words.add(w)
            out.append(w)
    return out


def write_crawl(path: Path, n: int, seed: int = 29) -> int:
    """Write n pages (see the docstring); the file's bytes."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    with open(path, "w", encoding="ascii") as fh:
        for lo in range(0, n, 20_000):
            m = min(20_000, n - lo)
            picks = rng.integers(0, VOCABULARY, size=(m, WORDS)).tolist()
            lines = []
            for i, row in enumerate(picks):
                pid = lo + i
                words = [vocab[w] for w in row]
                lines.append(
                    f'{{"url": "https://site-{pid % 5000}.example.com/a/{pid}", "html": '
                    f'"<html><head><title>{words[0]} {words[1]}</title></head><body><p>'
                    f'{" ".join(words)}</p></body></html>"}}\n')
            fh.write("".join(lines))
    return path.stat().st_size


def busy_jiffies() -> tuple[int, int]:
    """The machine's (busy, total) CPU jiffies since boot."""
    with open("/proc/stat") as fh:
        vals = [int(v) for v in fh.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return sum(vals) - idle, sum(vals)


def run_replay(checkout: Path, crawl: Path, tmp: Path) -> dict[str, Any]:
    summary = tmp / "summary.json"
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, "-P", "-m", "stream_dedup", "replay", str(crawl), "-o", os.devnull,
           "-q", "--summary-json", str(summary)]
    tick = os.sysconf("SC_CLK_TCK")
    busy0, _ = busy_jiffies()
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    samples: list[tuple[float, int]] = []
    hwm = [0]
    done = threading.Event()

    def sample() -> None:
        status = f"/proc/{child.pid}/status"
        while not done.is_set():
            try:
                with open(status) as fh:
                    for line in fh:
                        if line.startswith("VmRSS:"):
                            samples.append((time.perf_counter() - t0, int(line.split()[1]) * 1024))
                        elif line.startswith("VmHWM:"):
                            hwm[0] = max(hwm[0], int(line.split()[1]) * 1024)
            except (OSError, ValueError):
                pass
            done.wait(0.05)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    err = child.stderr.read() if child.stderr else ""
    _, status, usage = os.wait4(child.pid, 0)  # usage: CPU times (its ru_maxrss: see above)
    wall = time.perf_counter() - t0
    done.set()
    watcher.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    busy1, _ = busy_jiffies()
    if child.returncode != 0:
        raise RuntimeError(f"replay exited {child.returncode}: {err.strip()[-600:]}")
    s = json.loads(summary.read_text())
    cpu = usage.ru_utime + usage.ru_stime
    peak_at = max(samples, key=lambda p: p[1])[0] / wall if samples else float("nan")
    return {"pages": s["pages"], "held": int(s["index"]["pages"]), "kept": s["kept"],
            "peak": max(hwm[0], s["memory"]["peak_rss"]), "steady": s["memory"]["rss"],
            "peak_at": peak_at, "wall": wall, "cpu": cpu,
            "others": max(0.0, (busy1 - busy0) / tick - cpu) / wall}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, nargs="+", default=[50_000, 300_000, 1_000_000],
                    help="crawl sizes; the smallest is the base of the slopes")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each checkout at each size")
    ap.add_argument("--before", type=Path, default=None,
                    help="an older checkout, run alternated with this one")
    ap.add_argument("--tmp", type=Path, default=None, help="where the crawl file goes")
    args = ap.parse_args(argv)
    print(benchlib.header("# bench/replay_memory.py"))
    sides = [("this", HERE)] + ([("before", args.before.resolve())] if args.before else [])
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    sizes = sorted(set(args.pages))
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="replay-memory-") as d:
        tmp = Path(d)
        for n in sizes:
            crawl = tmp / f"crawl-{n}.jsonl"
            t0 = time.perf_counter()
            size = write_crawl(crawl, n)
            print(f"- {n:,} pages: crawl file {size / 1e6:,.0f} MB written in "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
            for r in range(args.rounds):
                order = sides if r % 2 == 0 else sides[::-1]
                for name, checkout in order:
                    got = run_replay(checkout, crawl, tmp)
                    results.setdefault((name, n), []).append(got)
                    print(f"  {name} round {r + 1}: held {got['held']:,}, peak "
                          f"{got['peak'] / 2**20:,.0f} MiB, steady "
                          f"{(got['steady'] or 0) / 2**20:,.0f} MiB, {got['wall']:.1f} s wall, "
                          f"{got['cpu']:.1f} s CPU, others {got['others']:.2f} cores",
                          flush=True)
            crawl.unlink()
    print_tables(results, sides, sizes)
    return 0


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def print_tables(results: dict[tuple[str, int], list[dict[str, Any]]],
                 sides: list[tuple[str, Path]], sizes: list[int]) -> None:
    base = sizes[0]
    rows = []
    for name, _ in sides:
        b = results[(name, base)]
        for n in sizes:
            runs = results[(name, n)]
            held = _median(runs, "held")
            row: list[object] = [name, f"{n:,}", f"{held:,.0f}", _median(runs, "peak") / 2**20,
                                 _median(runs, "steady") / 2**20]
            if n == base:
                row += ["(base)", "(base)"]
            else:
                dh = held - _median(b, "held")
                row += [(_median(runs, "peak") - _median(b, "peak")) / dh,
                        (_median(runs, "steady") - _median(b, "steady")) / dh]
            row += [_median(runs, "peak_at"), _median(runs, "wall"), _median(runs, "cpu"),
                    held / _median(runs, "wall"), _median(runs, "others")]
            rows.append(row)
    print(f"\n## replay, default settings: whole-process RSS (slopes against {base:,} pages)\n")
    print(table(["checkout", "pages", "held", "peak MiB", "steady MiB", "peak B/page held",
                 "steady B/page held", "peak at (share of run)", "wall s", "CPU s",
                 "pages/s", "others' CPU (cores)"], rows))
    if len(sides) == 2:
        ratio_rows = []
        for n in sizes:
            a, b = results[("this", n)], results[("before", n)]
            walls = [x["wall"] / y["wall"] for x, y in zip(a, b, strict=True)]
            cpus = [x["cpu"] / y["cpu"] for x, y in zip(a, b, strict=True)]
            ratio_rows.append([f"{n:,}", float(np.median(walls)),
                               f"{min(walls):.3f}-{max(walls):.3f}", float(np.median(cpus)),
                               f"{min(cpus):.3f}-{max(cpus):.3f}",
                               _median(a, "peak") / _median(b, "peak")])
        print("\n## this ÷ before, alternated runs (medians of the per-round ratios)\n")
        print(table(["pages", "wall", "wall min-max", "CPU", "CPU min-max", "peak RSS"],
                    ratio_rows))


if __name__ == "__main__":
    sys.exit(main())
