#!/usr/bin/env python3
"""One core on one big WARC: `replay --workers 1` against the parse+text ceiling (issue 29).

The ceiling is what any filter of these pages has to do at least: FastWARC reads the
records (gunzip, WARC and HTTP headers, content-coded bodies decoded: `auto_decode=
"content"`, without which a gzip or brotli body has no text to take; "all" would also undo
chunking, but stops at the corpus's records that say chunked and are not), and selectolax
(lexbor) parses each HTML response and takes its visible text (`body.text()`). No
fingerprints, no shingles, no index, no output. Ours is the product as a user runs it:
`python -m stream_dedup replay FILE --workers 1 -o /dev/null -q`, one decision a page
written (to /dev/null).

Both are whole processes, pinned to the same core (`taskset -c`), alternated over the
rounds. The figure is ceiling CPU seconds ÷ ours (user + system of the child, so a busy
second core does not move it), median over the rounds; wall seconds are printed beside.
Interpreter start and imports are in both (the ceiling imports fastwarc and selectolax,
ours its package, from cached bytecode as an installed package has it: the children run
without PYTHONDONTWRITEBYTECODE, after one untimed run of each); the one-process start cost
is printed too, to read the figure net of it.

The files are built at run time by bigwarc.py (never kept): `big` (the corpus's HTML
responses again and again, bodies exact copies from the second round), `big-distinct`
(new text each round) and `big-edited` (recrawls of the same URLs, 1 word in 100 changed a
round: near-duplicates, not copies; `--inputs big-edited`).

    python bench/onecore.py                       # 5 rounds, both files, core 0
    python bench/onecore.py --before CHECKOUT     # the same, and that checkout's replay
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bigwarc
from benchlib import REPO, header, table

CEILING = r"""
import sys
from fastwarc.warc import ArchiveIterator, WarcRecordType
from selectolax.lexbor import LexborHTMLParser
pages = chars = 0
with open(sys.argv[1], "rb") as fh:
    for record in ArchiveIterator(fh, record_types=WarcRecordType.response, parse_http=True,
                                  auto_decode=sys.argv[2]):
        body = record.reader.read()
        tree = LexborHTMLParser(body)
        chars += len(tree.body.text() if tree.body is not None else "")
        pages += 1
print(pages, chars)
"""


def child_cpu(cmd: list[str], cpu: int, cwd: Path) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, stdout) of one pinned child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    out = subprocess.run(["taskset", "-c", str(cpu), *cmd], check=True, cwd=cwd,
                         env=dict(env, PYTHONPATH=str(cwd)), capture_output=True,
                         text=True).stdout
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu_s, wall, out


def ours_cmd(path: Path) -> list[str]:
    return [sys.executable, "-m", "stream_dedup", "replay", str(path), "--workers", "1",
            "-o", os.devnull, "-q"]


def ceiling_cmd(path: Path, decode: str) -> list[str]:
    return [sys.executable, "-c", CEILING, str(path), decode]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--inputs", default="big,big-distinct")
    ap.add_argument("--mb", type=float, default=62, help="size of the built WARC files")
    ap.add_argument("--cpu", type=int, default=0, help="the core both sides are pinned to")
    ap.add_argument("--code", type=Path, default=REPO, help="checkout whose replay runs")
    ap.add_argument("--ceiling-decode", choices=("content", "none"), default="content",
                    help="FastWARC's auto_decode in the ceiling (none: bodies left gzipped)")
    ap.add_argument("--before", type=Path, metavar="CHECKOUT",
                    help="also run this checkout's replay (its C extension built), alternated")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name in args.inputs.split(","):
            files[name] = Path(tmp) / f"{name}.warc.gz"
            bigwarc.write(files[name], int(args.mb * 1e6), distinct=name == "big-distinct",
                          edit=name == "big-edited")
        print(header("One core: replay --workers 1 against FastWARC + selectolax text"))
        start = [child_cpu([sys.executable, "-c", "pass"], args.cpu, args.code)[0]
                 for _ in range(3)]
        codes = {"ours": args.code} | ({"before": args.before} if args.before else {})
        rows = []
        for name, path in files.items():
            child_cpu(ceiling_cmd(path, args.ceiling_decode), args.cpu, args.code)  # untimed
            for code in codes.values():
                child_cpu(ours_cmd(path), args.cpu, code)
            cpu: dict[str, list[float]] = {k: [] for k in ("ceiling", *codes)}
            wall: dict[str, list[float]] = {k: [] for k in cpu}
            for _ in range(args.rounds):
                c, w, out = child_cpu(ceiling_cmd(path, args.ceiling_decode), args.cpu,
                                      args.code)
                cpu["ceiling"].append(c)
                wall["ceiling"].append(w)
                for label, code in codes.items():
                    c, w, _ = child_cpu(ours_cmd(path), args.cpu, code)
                    cpu[label].append(c)
                    wall[label].append(w)
            pages = int(out.split()[0])
            for label in codes:
                ratio = statistics.median(
                    a / b for a, b in zip(cpu["ceiling"], cpu[label], strict=True))
                wall_ratio = statistics.median(
                    a / b for a, b in zip(wall["ceiling"], wall[label], strict=True))
                rows.append([name, label, f"{path.stat().st_size / 1e6:.1f}", pages,
                             f"{min(cpu['ceiling']):.2f}", f"{min(cpu[label]):.2f}",
                             f"{min(cpu[label]) / pages * 1e6:.0f}", f"{ratio:.3f}",
                             f"{wall_ratio:.3f}",
                             f"{min(cpu['ceiling']) / min(cpu[label]):.3f}"])
        print(table(["input", "replay of", "MB", "pages", "ceiling CPU s (min)",
                     "replay CPU s (min)", "replay µs/page", "× ceiling (CPU, median)",
                     "× ceiling (wall)", "× ceiling (minima)"], rows))
        print(f"\none interpreter start (python -c pass): {min(start) * 1e3:.0f} ms CPU; "
              f"{args.rounds} rounds, pinned to core {args.cpu}")


if __name__ == "__main__":
    main()
