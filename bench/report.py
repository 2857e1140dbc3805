#!/usr/bin/env python3
"""What `stream-dedup report` costs on a crawl of 100k pages: its time and the page's size.

The crawl is built at run time from the corpus (bigwarc.py's records, never kept): round
0 is the corpus's HTML responses; an odd round recrawls the same URLs with 1 word in 100
edited (near-duplicates: `unchanged` or `changed`), an even one puts the same bodies on new
hosts (exact copies), until `--pages` records. It is replayed once (`replay --workers 2`,
decisions and summary kept), then reported twice, each in a process of its own: with the
crawl (the sampled views' pages found and their texts compared) and from the decisions
alone. Printed: pages, seconds (wall and CPU), the page's size.

    python bench/report.py [--pages 100000] [--dir /tmp/report-bench]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import zlib
from pathlib import Path

import bigwarc


def build(path: Path, pages: int) -> int:
    records = bigwarc.html_records()
    written, n = 0, 0
    with open(path, "wb") as out:
        while written < pages:
            for record in records[: pages - written]:
                packer = zlib.compressobj(6, zlib.DEFLATED, 31)
                out.write(packer.compress(bigwarc.in_round(record, n, False, edit=n % 2 == 1))
                          + packer.flush())
            written += min(len(records), pages - written)
            n += 1
    return written


def timed(args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(args, check=False, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/report-bench"))
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    crawl, decisions = args.dir / "crawl.warc.gz", args.dir / "decisions.jsonl"
    summary = args.dir / "summary.json"
    cli = [sys.executable, "-m", "stream_dedup"]
    if not decisions.exists():
        print(f"building {crawl}: {build(crawl, args.pages):,} records", file=sys.stderr)
        wall, _ = timed([*cli, "replay", str(crawl), "-o", str(decisions), "-q",
                         "--workers", "2", "--summary-json", str(summary)])
        print(f"replayed in {wall:.1f} s", file=sys.stderr)
    pages = json.loads(summary.read_text())["pages"]
    for name, extra in (("with the crawl", [str(crawl)]), ("decisions only", [])):
        out = args.dir / f"report-{'crawl' if extra else 'decisions'}.html"
        wall, cpu = timed([*cli, "report", str(decisions), *extra, "--summary-json",
                           str(summary), "-o", str(out)])
        print(f"report {name}: {pages:,} decisions, {wall:.1f} s wall, {cpu:.1f} s CPU, "
              f"{out.stat().st_size / 1e6:.2f} MB ({out})")


if __name__ == "__main__":
    main()
