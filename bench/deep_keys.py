#!/usr/bin/env python3
"""The memory index's deep containment keys (index/deep.py): RAM and disk a page held, and
the time a kept page's keys take to store (on average, and the longest: a store waits
for the last spill's writer thread when the table is full again before it is done) and a
page's asked keys to look up, at scale.

A child process holds only the deep-key store (the rest of the index is bench/memory.py's)
and feeds it --pages kept pages of --keys deep keys each (random 32-bit values: a page's
1/8 sample; bench/containment.py's pages have a median of ~700 shingles, so ~85 keys past
the 4 stored in RAM). RAM is VmRSS growth over the empty store (after gc), and its own
count (`nbytes`); disk is the runs' bytes. Then --probes pages ask --asked keys each (half
of them keys some page stores): µs a page asking, through the runs on disk (the page cache
warm, as on a machine with RAM to spare for it).

    python bench/deep_keys.py --pages 1000000
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import proc_status  # noqa: E402

from stream_dedup.index import deep  # noqa: E402
from stream_dedup.index.arena import records_home  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=85, help="deep keys a kept page (default 85)")
    ap.add_argument("--asked", type=int, default=3, help="deep keys a page asks (default 3)")
    ap.add_argument("--probes", type=int, default=20_000)
    ap.add_argument("--cap", type=int, default=8, help="rows a key (contain_common)")
    ap.add_argument("--seed", type=int, default=47)
    ap.add_argument("--rate", type=float, default=0,
                    help="kept pages a second to store at (default 0: flat out); e.g. "
                         "--pages 30000 --rate 2000: the waits a service would see")
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    store = deep.DeepKeys(records_home(""), args.cap, lambda rows: None)
    chunk = 10_000
    longest, slow = (0.0, 0), 0  # the longest single store (its page), stores over 50 ms
    gc.collect()
    before = proc_status()["VmRSS"]
    started = time.perf_counter()
    cpu = time.process_time()
    for first in range(0, args.pages, chunk):
        keys = rng.integers(0, 2**32, (min(chunk, args.pages - first), args.keys),
                            dtype=np.uint64)
        for i in range(keys.shape[0]):
            if args.rate and (ahead := started + (first + i) / args.rate
                              - time.perf_counter()) > 0:
                time.sleep(ahead)
            t = time.perf_counter()
            store.add(keys[i], first + i)
            took = time.perf_counter() - t
            longest = max(longest, (took, first + i))
            slow += took > 0.05
        if first and first % 200_000 == 0:
            print(f"  {first:,} pages, {len(store.runs)} runs", file=sys.stderr)
    add_wall, add_cpu = time.perf_counter() - started, time.process_time() - cpu
    # The last spill's runs in (its table gone). getattr here and below: this script also
    # runs in an older checkout, whose store wrote out in the storing call (no writer).
    getattr(store, "settle", lambda: None)()
    gc.collect()
    grown = proc_status()["VmRSS"] - before
    counted = store.nbytes()

    # lookups: half of the asked keys some page stores (drawn again from the same seed)
    again = np.random.default_rng(args.seed)
    stored = again.integers(0, 2**32, (chunk, args.keys), dtype=np.uint64).ravel()
    probes = [np.concatenate((rng.choice(stored, args.asked - args.asked // 2),
                              rng.integers(0, 2**32, args.asked // 2, dtype=np.uint64)))
              for _ in range(args.probes)]
    cpu = time.process_time()
    started = time.perf_counter()
    found = sum(len(rows) for p in probes for rows in store.postings(p))
    ask_wall, ask_cpu = time.perf_counter() - started, time.process_time() - cpu

    n = args.pages
    print(f"# deep keys: {n:,} pages x {args.keys} keys, cap {args.cap}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs")
    print(f"RAM a page: {grown / n:.2f} B RSS growth ({counted['ram'] / n:.2f} B counted: "
          f"the newest entries and the fences)")
    print(f"disk a page: {counted['on_disk'] / n:.0f} B in {len(store.runs)} runs "
          f"({len(store):,} entries)")
    print(f"storing: {add_cpu / n * 1e6:.1f} µs CPU a page ({add_wall / n * 1e6:.1f} wall)")
    per_table = deep.SLOTS // 2 // args.keys
    print(f"the longest store: {longest[0] * 1000:.0f} ms (page {longest[1]:,}); {slow} stores "
          f"over 50 ms, stored at {n / add_wall:,.0f} pages/s")
    if (wrote := getattr(store, "longest_write", 0.0)) > 0:
        print(f"the longest write-out (a spill and its merges, in their thread): "
              f"{wrote * 1000:.0f} ms; a table holds {per_table:,} pages, so a store waits "
              f"only above {per_table / wrote:,.0f} kept pages/s")
    print(f"asking {args.asked} keys: {ask_cpu / args.probes * 1e6:.1f} µs CPU a page "
          f"({ask_wall / args.probes * 1e6:.1f} wall; {found / args.probes:.2f} rows found)")
    store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
