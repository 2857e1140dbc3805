#!/usr/bin/env python3
"""What a page held costs the process (issue 16): RSS growth per page of the default memory
index, with its breakdown, and the LSM directory's bytes per page on disk.

Each size runs in a fresh child process. The child generates kept pages 10,000 at a time
(their transient memory is small and reused) and drives the index through its seam as the
deduplicator does (bench/index_bench.py's loop): per batch of --batch pages one `lookup`
(exact layers + the 6 features' and 5 band keys' posting lists), one `claim` of the batch
(every page kept), one `commit`. A --dup-share of the pages reuses 3 features of one of the
65,536 most recent pages, so lookups find candidates (a ring buffer allocated before the
baseline, so it is not counted).

The records are built the way the engine builds them (measured on the WARC replay:
`StoredDoc` from decide._keep): `features` (6 features + 5 band keys) and `sketch` are
numpy views on `bytes` objects (what the native kernels return: 88 and 336 bytes), the
shingle set for exact verification (--shingle-bytes, 4 a shingle: the long WARC pages' mean
is 4,416 B with sets sampled past 8,192 shingles, 7,644 B whole; random values), a 300-byte
LD signature (the WARC pages' mean is 316 B for a 9,400-character text at c = 32; 115 equally
likely byte values, the entropy of theirs), a 60-character URL (WARC mean 61, each page a
URL of its own), a 20-character `fetched_at`, 64-bit raw and canonical fingerprints (Python
ints), text_length 9,400, the page id.

Measured in the child: VmRSS after minus before (gc'd both times; the index is not flushed,
as in the service), again after `malloc_trim(0)`, and peak (VmHWM) minus before; pages/s
through the seam (lookup + claim + commit, not the record generation). Breakdown: the index
structures' `nbytes()` (features; raw + canonical exact layers), the `_docs` list's pointer
array, and per record `sys.getsizeof` of each part on a sample of 10,000 records (numpy
array objects and their `bytes` buffers apart); "allocator" rounds each part up as the
allocators do (pymalloc: 16-byte classes up to 512 B; glibc malloc: 8-byte header, 16-byte
chunks); the remainder of the RSS growth is listed as unexplained.

A memory child stops early, and the table says at how many pages, when /proc/meminfo's
MemAvailable falls below --min-available-gib (1.5): on a shared 24 GB machine 10M pages
of today's records may not fit (a note says what the smaller run extrapolates to).

Each memory size runs twice: `--memory-records disk` (the default: sketches and LD
signatures in the record file) and `ram`; the table also gives the file's bytes a page and
the time of a record read (20,000 at random, after the run).

Reading the figures: the peak includes the script's own chunks of records (10,000 pages of
shingle sets at a time). The shingle sets live in the record file, not in RAM, so a 10M
run may use small sets (--shingle-bytes 256) where mean-size records do not fit the disk.

    python bench/memory.py                           # memory 1M and 10M, LSM 1M
    python bench/memory.py --pages 1000000 --lsm-pages 100000 --records disk
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from benchlib import proc_status, table  # noqa: E402

from stream_dedup import Settings  # noqa: E402
from stream_dedup.index import MemoryIndex, StoredDoc  # noqa: E402
from stream_dedup.index.arena import DocArena  # noqa: E402
from stream_dedup.index.base import Claim, Probe  # noqa: E402

try:
    from stream_dedup.core.urls import UrlKeys  # noqa: E402

    URL_KEYS: Any = UrlKeys()
except ImportError:  # a checkout before issue 26 (recrawls): no URL map
    URL_KEYS = None

CHUNK = 10_000
RING = 65_536
# 6 features + 5 band keys + the containment keys (issue 27; none before it): Settings'
# defaults
KEYS = 11 + getattr(Settings(), "contain_keys", 0)
SHINGLE_BYTES = 4_416  # the long WARC pages' mean set (sampled past 8,192 shingles)
SIG_BYTES = 300
TEXT_LENGTH = 9_400
# LD signature symbols: the WARC replay's signatures carry 6.84 bits of entropy per byte
# (byte histogram); 115 equally likely byte values carry 6.85. It matters only on disk (LSM
# compression); a constant signature (bench/index_bench.py's) compresses to nothing.
SIG_ALPHABET = np.arange(70, 185, dtype=np.uint8)


def mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class Pages:
    """Kept pages as the engine would store them, chunk by chunk (see the docstring)."""

    def __init__(self, seed: int, dup_share: float, shingle_bytes: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.dup_share = dup_share
        self.shingle_bytes = shingle_bytes
        self.ring = np.zeros((RING, KEYS), dtype=np.uint64)

    def chunk(self, lo: int, m: int) -> tuple[list[Probe], list[StoredDoc]]:
        rng = self.rng
        feats = rng.integers(0, 2**64 - 1, size=(m, KEYS), dtype=np.uint64, endpoint=True)
        for i in np.flatnonzero(rng.random(m) < self.dup_share).tolist():
            held = min(lo, RING)  # the ring holds the earlier chunks' pages
            if held:
                feats[i, :3] = self.ring[int(rng.integers(0, held)), :3]
        fps = rng.integers(0, 2**64 - 1, size=(m, 2), dtype=np.uint64, endpoint=True).tolist()
        blob = rng.bytes(m * 336)
        symbols = rng.integers(0, SIG_ALPHABET.shape[0], size=m * SIG_BYTES)
        sigs = SIG_ALPHABET[symbols].tobytes()
        fbytes = feats.tobytes()
        sets = rng.bytes(m * self.shingle_bytes)  # random: an LSM block cannot compress it
        kb, sb = KEYS * 8, self.shingle_bytes
        probes, docs = [], []
        stamp = time.strftime("%Y-%m-%dT%H:%M:", time.gmtime())
        for i in range(m):
            pid = lo + i
            o = i * 336
            features = np.frombuffer(fbytes[i * kb : i * kb + kb], dtype=np.uint64)
            sketch = np.frombuffer(blob[o : o + 336], dtype=np.uint32)
            raw_fp, canonical_fp = fps[i]
            url = f"https://www.site-{pid % 5000:04d}.example.com/news/2026/11/article-{pid}.html"
            # Every page a URL of its own: the URL map holds an entry a page (issue 26;
            # a checkout before it has no URL map, and these are left out)
            key = {"url_key": URL_KEYS.key(url)} if URL_KEYS is not None else {}
            probes.append(Probe(pid, raw_fp, canonical_fp, features, **key))
            docs.append(StoredDoc(
                url, features, sketch, sigs[i * SIG_BYTES : (i + 1) * SIG_BYTES], TEXT_LENGTH,
                raw_fp, canonical_fp, f"{stamp}{pid % 60:02d}Z", pid,
                sets[i * sb : (i + 1) * sb], **key,
            ))
        ring_at = np.arange(lo, lo + m) % RING
        self.ring[ring_at] = feats
        return probes, docs


def _rounded(size: int) -> int:
    """Bytes an allocation of `size` takes: pymalloc classes of 16 up to 512 B, then glibc
    malloc chunks (8-byte header, 16-byte alignment, 32 minimum)."""
    if size <= 512:
        return -(-size // 16) * 16
    return max(32, -(-(size + 8) // 16) * 16)


def record_breakdown(docs: list[StoredDoc], sample: int = 10_000) -> dict[str, tuple[float, float]]:
    """Per record part: (mean sys.getsizeof, mean with allocator rounding) on a sample."""
    rng = np.random.default_rng(5)
    picks = rng.choice(len(docs), size=min(sample, len(docs)), replace=False).tolist()
    parts: dict[str, list[tuple[int, int]]] = {}

    def add(name: str, *objs: Any) -> None:
        sizes = [sys.getsizeof(o) for o in objs if o is not None]
        parts.setdefault(name, []).append((sum(sizes), sum(_rounded(s) for s in sizes)))

    for i in picks:
        d = docs[i]
        add("StoredDoc object (9 slots)", d)
        for name, arr in (("features: ndarray object", d.features),
                          ("sketch: ndarray object", d.sketch)):
            add(name, arr)
            base = arr.base
            add(name.replace("ndarray object", "its bytes buffer"),
                base if isinstance(base, bytes) else None)
        add("LD signature (bytes)", d.ld_signature)
        add("URL (str)", d.url)
        add("fetched_at (str)", d.fetched_at)
        big = [x for x in (d.raw_fp, d.canonical_fp, d.page_id, d.text_length)
               if not -5 <= x <= 256]  # small ints are shared
        add("4 ints (raw_fp, canonical_fp, page_id, text_length)", *big)
    return {k: (float(np.mean([a for a, _ in v])), float(np.mean([b for _, b in v])))
            for k, v in parts.items()}


def child_memory(n: int, batch: int, dup_share: float, floor: float, records: str,
                 tmp: str | None, shingle_bytes: int) -> dict[str, Any]:
    gen = Pages(20261124, dup_share, shingle_bytes)
    index = MemoryIndex(Settings().params.stamp, Settings().max_posting,
                        (tmp or "") if records == "disk" else None)
    gc.collect()
    _trim()
    before = proc_status()
    spent = 0.0
    found = 0
    reached = n
    perf = time.perf_counter
    for lo in range(0, n, CHUNK):
        if mem_available() < floor:
            reached = lo
            break
        probes, docs = gen.chunk(lo, min(CHUNK, n - lo))
        for b in range(0, len(probes), batch):
            ps, ds = probes[b : b + batch], docs[b : b + batch]
            t0 = perf()
            for answer in index.lookup(ps):
                found += sum(1 for posting in answer.postings if posting)
            index.claim([Claim(p, d) for p, d in zip(ps, ds, strict=True)])
            index.commit({"bench/0": lo + b + len(ps)})
            spent += perf() - t0
        del probes, docs
    gc.collect()
    after = proc_status()
    _trim()
    trimmed = proc_status()
    stats = index.stats()
    columns = isinstance(index._docs, DocArena)  # else a list of StoredDoc objects (before)
    t0 = perf()
    reads = [index.doc(row) for row in gen.rng.integers(0, reached, 20_000).tolist()]
    read_us = (perf() - t0) / len(reads) * 1e6
    return {
        "pages": reached,
        "records": records,
        "read_us": read_us,
        "record_file_bytes": index.stats()["doc_file_bytes"],
        "seconds": spent,
        "candidates_found": found,
        "feature_bytes": index._features.nbytes(),
        "exact_bytes": sum(m.nbytes() for m in index._exact),
        # the URL map and the replaced rows' bits (issue 26; none before it)
        "url_bytes": (index._urls.nbytes() + len(index._retired)) if hasattr(index, "_urls")
        else 0,
        "docs_list_bytes": 0 if columns else sys.getsizeof(index._docs),
        "doc_store_nbytes": stats["doc_store_bytes"],
        "parts": ({f"records as columns: {part}": (b / reached, b / reached)
                     for part, b in index._docs.nbytes.items() if part != "on_disk"} if columns
                    else record_breakdown(index._docs)),
        "rss_delta": after["VmRSS"] - before["VmRSS"],
        "rss_trimmed": trimmed["VmRSS"] - before["VmRSS"],
        "peak_delta": after["VmHWM"] - before["VmRSS"],
    }


def child_lsm(n: int, batch: int, dup_share: float, tmp: str | None,
              shingle_bytes: int) -> dict[str, Any]:
    from stream_dedup.index.lsm import LsmIndex

    where = Path(tempfile.mkdtemp(dir=tmp))
    try:
        gen = Pages(20261124, dup_share, shingle_bytes)
        index = LsmIndex(where / "lsm", Settings().params.stamp)
        spent = 0.0
        for lo in range(0, n, CHUNK):
            probes, docs = gen.chunk(lo, min(CHUNK, n - lo))
            for b in range(0, len(probes), batch):
                ps, ds = probes[b : b + batch], docs[b : b + batch]
                t0 = time.perf_counter()
                index.lookup(ps)
                index.claim([Claim(p, d) for p, d in zip(ps, ds, strict=True)])
                index.commit({"bench/0": lo + b + len(ps)})
                spent += time.perf_counter() - t0
        t0 = time.perf_counter()
        index.compact()
        compact_s = time.perf_counter() - t0
        features = index.stats()["index_bytes_per_page"]
        index.close()
        total = sum(f.stat().st_size for f in (where / "lsm").rglob("*") if f.is_file())
        return {"pages": n, "seconds": spent, "compact_seconds": compact_s,
                "features_bytes_per_page": features, "dir_bytes": total}
    finally:
        shutil.rmtree(where, ignore_errors=True)


def run_child(args: list[str]) -> dict[str, Any] | str:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        return "failed: " + done.stderr.strip()[-300:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def memory_tables(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        n = r["pages"]
        rows.append([f"{n:,}", r["records"], n / r["seconds"], r["rss_delta"] / n,
                     r["rss_trimmed"] / n, r["peak_delta"] / 2**20,
                     (r["feature_bytes"] + r["exact_bytes"] + r.get("url_bytes", 0)) / n,
                     r["doc_store_nbytes"] / n,
                     r["record_file_bytes"] / n, r["read_us"]])
    out = table(["pages held", "--memory-records", "pages/s (lookup + claim + commit)",
                 "RSS Δ B/page", "… after malloc_trim", "peak RSS Δ MiB",
                 "index structures B/page", "records in RAM B/page", "record file B/page",
                 "µs a record read (20,000 random)"], rows) + "\n\n"
    for r in results:
        n = r["pages"]
        parts: list[list[object]] = [
            ["feature table (SortedRunMultimap nbytes)", r["feature_bytes"] / n,
             r["feature_bytes"] / n],
            ["exact layers, raw + canonical (nbytes)", r["exact_bytes"] / n, r["exact_bytes"] / n],
            ["URL map and replaced-row bits (nbytes)", r.get("url_bytes", 0) / n,
             r.get("url_bytes", 0) / n],
            ["_docs list (pointer array)", r["docs_list_bytes"] / n, r["docs_list_bytes"] / n],
        ]
        parts += [[k, a, b] for k, (a, b) in r["parts"].items()]
        total = sum(float(p[1]) for p in parts)  # type: ignore[arg-type]
        total_r = sum(float(p[2]) for p in parts)  # type: ignore[arg-type]
        parts.append(["**sum of the parts**", total, total_r])
        parts.append(["RSS Δ (after malloc_trim) minus the sum", r["rss_trimmed"] / n - total,
                      r["rss_trimmed"] / n - total_r])
        out += (f"Breakdown at {n:,} pages, --memory-records {r['records']} (B/page of "
                f"RAM):\n\n")
        out += table(["part", "sys.getsizeof / nbytes", "with allocator rounding"], parts)
        out += "\n\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--lsm-pages", type=int, default=1_000_000, help="0: no LSM run")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--dup-share", type=float, default=0.2)
    ap.add_argument("--records", nargs="+", default=["disk", "ram"], choices=["disk", "ram"],
                    help="where the memory index keeps what verification reads (both)")
    ap.add_argument("--tmp", default=None, help="where the LSM directory and the memory "
                    "index's record file go")
    ap.add_argument("--shingle-bytes", type=int, default=SHINGLE_BYTES,
                    help="a record's shingle set (4 B a shingle; default the long WARC pages' "
                    "mean). It goes to the record file, not RAM: 10M pages of the default need "
                    "~76 GB of disk")
    ap.add_argument("--min-available-gib", type=float, default=1.5,
                    help="a memory child stops when MemAvailable falls below this (1.5)")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        kind, n = args.child[0], int(args.child[1])
        r = (child_memory(n, args.batch, args.dup_share, args.min_available_gib * 2**30,
                          kind.split(":")[1], args.tmp, args.shingle_bytes)
             if kind.startswith("memory")
             else child_lsm(n, args.batch, args.dup_share, args.tmp, args.shingle_bytes))
        print(json.dumps(r))
        return 0
    print(benchlib.header("# bench/memory.py"))
    common = ["--batch", str(args.batch), "--dup-share", str(args.dup_share),
              "--shingle-bytes", str(args.shingle_bytes),
              "--min-available-gib", str(args.min_available_gib)]
    results: list[dict[str, Any]] = []
    notes = []
    for n, records in [(n, r) for n in sorted(args.pages) for r in args.records]:
        if results:  # what the smaller run says this one needs; the child's floor guards
            per_page = results[-1]["peak_delta"] / results[-1]["pages"]
            room = mem_available() - args.min_available_gib * 2**30
            if per_page * n > room:
                notes.append(
                    f"{n:,} pages: MemAvailable {mem_available() / 2**30:.1f} GiB at the start, "
                    f"the {results[-1]['pages']:,}-page peak extrapolates to "
                    f"{per_page * n / 2**30:.1f} GiB: expected to stop at the "
                    f"{args.min_available_gib} GiB floor near {room / per_page:,.0f} pages")
        t0 = time.perf_counter()
        r = run_child(["--child", f"memory:{records}", str(n), *common]
                      + (["--tmp", args.tmp] if args.tmp else []))
        if isinstance(r, str):
            notes.append(f"{n:,} pages: {r}")
            continue
        if r["pages"] < n:
            notes.append(f"{n:,} pages: stopped at {r['pages']:,} (MemAvailable < "
                         f"{args.min_available_gib} GiB)")
        notes.append(f"{r['pages']:,} pages, {records}: child ran "
                     f"{time.perf_counter() - t0:.0f} s wall")
        results.append(r)
    print("## MemoryIndex (the default index): process RSS per page held\n")
    print(memory_tables(results))
    for note in notes:
        print(f"- {note}")
    if args.lsm_pages:
        r = run_child(["--child", "lsm", str(args.lsm_pages), *common]
                      + (["--tmp", args.tmp] if args.tmp else []))
        print("\n## LsmIndex: directory on disk after compaction (same records)\n")
        if isinstance(r, str):
            print(r)
        else:
            n = r["pages"]
            print(table(["pages", "pages/s (lookup + claim + commit)", "compaction s",
                         "features column family B/page", "whole directory B/page"],
                        [[f"{n:,}", n / r["seconds"], r["compact_seconds"],
                          r["features_bytes_per_page"], r["dir_bytes"] / n]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
