"""Forgetting a host on the in-process backends: an index of `--pages` pages, `--host-pages`
of them on one host (in namespace "a", the rest spread over 1,000 other hosts), then
`forget --host` of that host, timed; for LSM the directory's bytes before, after the
forget and after a compaction (`index compact`), and the index reopened.

The records are made directly (no analysis): 6 features + 5 band keys, an 84-value sketch,
`--shingles` shingles (4 bytes each: a mean web page has ~1,200) and a 32-byte signature.

    python bench/forget.py --pages 200000 --host-pages 100000 --backends lsm memory
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from stream_dedup.index import MemoryIndex
from stream_dedup.index.base import Claim, Probe, StoredDoc
from stream_dedup.index.lsm import LsmIndex
from stream_dedup.index.namespaces import salted_doc, selector

HOST = "big.example"


def docs(n: int, host_pages: int, shingles: int, seed: int = 1) -> list[StoredDoc]:
    rng = np.random.default_rng(seed)
    out = []
    keys = rng.integers(1, 2**63, size=(n, 11), dtype=np.uint64)
    fps = rng.integers(1, 2**63, size=(n, 2), dtype=np.uint64)
    sketch = rng.integers(0, 2**32, size=84, dtype=np.uint32)
    tops = rng.integers(0, 2**32, size=shingles, dtype=np.uint32).astype("<u4").tobytes()
    for i in range(n):
        host = HOST if i % 2 == 0 and i // 2 < host_pages else f"h{i % 1000}.example"
        doc = StoredDoc(f"http://{host}/p/{i}", keys[i], sketch, b"s" * 32, 2000,
                        int(fps[i, 0]), int(fps[i, 1]), "2026-11-01T00:00:00Z", i + 1, tops,
                        url_key=int(keys[i, 0]) ^ 0x55)
        out.append(salted_doc(doc, "a"))  # type: ignore[arg-type]
    return out


def fill(index: MemoryIndex | LsmIndex, pages: list[StoredDoc], batch: int = 2000) -> None:
    for start in range(0, len(pages), batch):
        claims = [Claim(Probe(d.page_id, d.raw_fp, d.canonical_fp, d.features, d.url_key), d)
                  for d in pages[start : start + batch]]
        index.claim(claims)
        index.commit()


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=200_000)
    ap.add_argument("--host-pages", type=int, default=100_000)
    ap.add_argument("--shingles", type=int, default=1200)
    ap.add_argument("--backends", nargs="+", default=["lsm", "memory"])
    ap.add_argument("--dir", default=None, help="where the LSM index goes (a temp dir)")
    a = ap.parse_args()
    pages = docs(a.pages, a.host_pages, a.shingles)
    what = selector(namespace="a", host=HOST)
    for backend in a.backends:
        with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
            path = Path(tmp) / "index"
            index: MemoryIndex | LsmIndex = (LsmIndex(path, 1) if backend == "lsm"
                                             else MemoryIndex(1))
            started = time.perf_counter()
            fill(index, pages)
            filled = time.perf_counter() - started
            before = du(path) if backend == "lsm" else 0
            started = time.perf_counter()
            gone = index.forget(what)
            took = time.perf_counter() - started
            print(f"{backend}: {a.pages:,} pages ({a.shingles} shingles each) filled in "
                  f"{filled:.1f} s; forget --host of {len(gone):,} pages: {took:.2f} s "
                  f"({took / max(1, len(gone)) * 1e6:.1f} µs a page); "
                  f"held after: {len(index):,}")
            assert len(gone) == a.host_pages and len(index) == a.pages - a.host_pages
            if isinstance(index, LsmIndex):
                after = du(path)
                started = time.perf_counter()
                index.compact()
                compacted = time.perf_counter() - started
                print(f"  disk: {before / 2**20:,.1f} MiB before, {after / 2**20:,.1f} after "
                      f"the forget, {du(path) / 2**20:,.1f} after compaction "
                      f"({compacted:.1f} s); stats pages {index.stats()['pages']:,}")
                index.close()
                started = time.perf_counter()
                again = LsmIndex(path, 1)
                print(f"  reopened in {time.perf_counter() - started:.2f} s: "
                      f"{len(again):,} pages, {again.namespaces()}")
                again.close()
            else:
                index.close()
            os.sync()


if __name__ == "__main__":
    main()
