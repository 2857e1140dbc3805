"""Feature index benchmark: memory vs LSM in one run (issue: persistent LSM index).

For N pages (generated features: 6 random 64-bit features, raw and canonical fingerprints,
an 84-value sketch and a short LD signature per page) it measures, per backend:
  - insert+lookup throughput: for each page, the lookups the pipeline does (raw and canonical
    fingerprint, candidates for the 6 features) then the insert; commits every --batch pages
    (the service commits once per Kafka batch);
  - bytes per page: memory = the index structures (features + exact maps);
    LSM = the features column family on disk after a flush + compaction, and the whole
    directory (docs included).
A share of pages (--dup-share) reuses 3 features of an earlier page, so lookups find
candidates as they do on a real crawl.

    python bench/index_bench.py --pages 1000000 10000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from stream_dedup.index import CANONICAL, RAW, MemoryIndex, StoredDoc
from stream_dedup.index.lsm import LsmIndex


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(backend: str, pages: int, batch: int, dup_share: float, seed: int, tmp: Path) -> dict:
    rng = np.random.default_rng(seed)
    features = rng.integers(0, 2**63, size=(pages, 6), dtype=np.uint64)
    dups = np.flatnonzero(rng.random(pages) < dup_share)
    dups = dups[dups > 0]
    sources = rng.integers(0, dups, dtype=np.int64) if dups.size else dups
    features[dups, :3] = features[sources, :3]
    sketches = rng.integers(0, 2**32, size=(4096, 84), dtype=np.uint32)  # realistic entropy
    index = (MemoryIndex(1) if backend == "memory" else LsmIndex(tmp / "lsm", 1))
    found = 0
    started = time.perf_counter()
    for i in range(pages):
        feats = features[i]
        index.first_with(RAW, i)
        index.first_with(CANONICAL, i + pages)
        found += len(index.candidates(feats, 2))
        sketch = sketches[i % 4096] ^ np.uint32(i)
        index.insert(StoredDoc(f"http://bench/{i}", feats, sketch, b"0123456789abcdef", 9000,
                               i, i + pages))
        if i % batch == batch - 1:
            index.commit({"bench/0": i + 1})
    index.commit({"bench/0": pages})
    seconds = time.perf_counter() - started
    stats = index.stats()
    result = {"backend": backend, "pages": pages, "seconds": seconds,
              "pages_per_s": pages / seconds, "candidates_found": found}
    if isinstance(index, LsmIndex):
        index.compact()
        stats = index.stats()
        result["index_bytes_per_page"] = stats["index_bytes_per_page"]
        index.close()
        result["dir_bytes_per_page"] = _dir_bytes(tmp / "lsm") / pages
    else:
        result["index_bytes_per_page"] = stats["index_bytes_per_page"]
        result["dir_bytes_per_page"] = float("nan")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--backends", nargs="+", default=["memory", "lsm"])
    parser.add_argument("--batch", type=int, default=500, help="pages per commit (500)")
    parser.add_argument("--dup-share", type=float, default=0.2)
    parser.add_argument("--tmp", default=None, help="where the LSM directory goes")
    args = parser.parse_args()
    print(f"# {' '.join(sys.argv)}  (nproc={os.cpu_count()}, python {sys.version.split()[0]})")
    print(f"{'backend':<8} {'pages':>10} {'seconds':>9} {'pages/s':>10} {'ops/s':>10} "
          f"{'index B/page':>13} {'dir B/page':>11}")
    for pages in args.pages:
        for backend in args.backends:
            tmp = Path(tempfile.mkdtemp(dir=args.tmp))
            try:
                r = run(backend, pages, args.batch, args.dup_share, 7, tmp)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            # a page = 8 lookups (2 exact + 6 features) + 8 writes (2 exact + 6 features)
            print(f"{r['backend']:<8} {r['pages']:>10,} {r['seconds']:>9.1f} "
                  f"{r['pages_per_s']:>10,.0f} {16 * r['pages_per_s']:>10,.0f} "
                  f"{r['index_bytes_per_page']:>13.1f} {r['dir_bytes_per_page']:>11.1f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
