"""Forgetting a host on the Redis index: how long `RedisIndex.forget` takes and how much
Redis memory it gives back.

It fills an EMPTY Redis (it flushes it) through the index seam, as bench/index_bench.py
does (lookup then claim, every page kept: 13 random index keys, raw and canonical
fingerprints, a URL key, an 84-value sketch, a 200-byte LD signature and a
--shingle-bytes shingle set a page), with --pages pages of one host and --other pages of
another, in one namespace (--namespace; "" the default). Then it times, each once:

  namespaces  the scan `index stats` makes (every record bucket, KEEP pages' light records)
  forget      `forget(selector(host=<the big host>))`: the scan, then the pages retired
              (KEEP -> R, verification record deleted, refs out of every key)
  again       the same forget again (nothing left: the scan alone)

and prints seconds, pages forgotten, the count of pages held before and after, and
`used_memory` (summed over the primaries, and over the records store's) before and after.

    python bench/forget_redis.py --redis-url redis://127.0.0.1:7200 --pages 100000
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # run from a checkout, as benchlib does

from indexkit import flush_redis  # noqa: E402

from stream_dedup.index import StoredDoc  # noqa: E402
from stream_dedup.index.base import Claim, Probe  # noqa: E402
from stream_dedup.index.namespaces import salted_doc, salted_probe, selector  # noqa: E402
from stream_dedup.index.redis.backend import RedisIndex  # noqa: E402
from stream_dedup.index.redis.client import memory  # noqa: E402
from stream_dedup.models import Decision  # noqa: E402


def fill(index: RedisIndex, hosts: list[tuple[str, int]], batch: int, shingle_bytes: int,
         namespace: str, seed: int = 7) -> None:
    """Every page kept, through lookup and claim, in batches of `batch`."""
    pages = sum(n for _, n in hosts)
    rng = np.random.default_rng(seed)
    features = rng.integers(0, 2**63, size=(pages, 13), dtype=np.uint64)
    urls = rng.integers(1, 2**63, size=pages, dtype=np.uint64).tolist()
    sketches = rng.integers(0, 2**32, size=(4096, 84), dtype=np.uint32)
    signature = bytes(range(200))
    sets = rng.bytes(shingle_bytes + 4096)
    names = [host for host, n in hosts for _ in range(n)]
    order = rng.permutation(pages)  # the hosts' pages interleaved, as a crawl has them
    ids = index.local_ids(pages)
    for start in range(0, pages, batch):
        probes, docs = [], []
        for j in range(start, min(pages, start + batch)):
            i = int(order[j])
            probe = Probe(ids[j], i + 1, i + 1 + pages, features[i], urls[i])
            doc = StoredDoc(f"https://{names[i]}/news/article/{i}.html", features[i],
                            sketches[i % 4096] ^ np.uint32(i), signature, 9000, i + 1,
                            i + 1 + pages, "2026-11-01T00:00:00Z", ids[j],
                            sets[i % 4096 : i % 4096 + shingle_bytes], urls[i])
            probes.append(salted_probe(probe, namespace))
            docs.append(salted_doc(doc, namespace))
        index.lookup(probes)
        won = index.claim([Claim(p, d, Decision(d.url, "keep", "unique", page_id=d.page_id))
                           for p, d in zip(probes, docs, strict=True)])
        assert all(won)


def used(index: RedisIndex) -> tuple[int, int]:
    """used_memory of the index's Redis and of its records store (0: none), summed over
    their primaries (without the namespaces scan stats() makes)."""
    return (memory(index.client)[1],
            memory(index.records)[1] if index.records is not None else 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:7000",
                        help="a node of an EMPTY Redis it may flush (deploy/redis-local)")
    parser.add_argument("--redis-records-url", default="",
                        help="another EMPTY Redis it may flush, for the records (none)")
    parser.add_argument("--pages", type=int, default=100_000, help="of the host forgotten")
    parser.add_argument("--other", type=int, default=10_000, help="of another host, kept")
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--namespace", default="crawl-7")
    parser.add_argument("--shingle-bytes", type=int, default=0,
                        help="a record's shingle set (0, as with --no-verify-exact; 4,416: "
                        "a mean WARC page's)")
    args = parser.parse_args()
    print(f"# {' '.join(sys.argv)}  (nproc={os.cpu_count()}, python {sys.version.split()[0]})")
    flush_redis(args.redis_url)
    if args.redis_records_url:
        flush_redis(args.redis_records_url)
    index = RedisIndex(args.redis_url, 1, records_url=args.redis_records_url)
    empty = used(index)
    started = time.perf_counter()
    fill(index, [("big.example", args.pages), ("small.example", args.other)], args.batch,
         args.shingle_bytes, args.namespace)
    print(f"filled {args.pages + args.other:,} pages in {time.perf_counter() - started:.1f} s")
    full, held = used(index), len(index)
    started = time.perf_counter()
    spaces = index.namespaces()
    scan_s = time.perf_counter() - started
    print(f"namespaces(): {scan_s:.2f} s  {spaces}")
    trips = index.round_trips
    started = time.perf_counter()
    gone = index.forget(selector(namespace=args.namespace, host="big.example"))
    forget_s = time.perf_counter() - started
    trips = index.round_trips - trips
    after, left = used(index), len(index)
    started = time.perf_counter()
    again = index.forget(selector(namespace=args.namespace, host="big.example"))
    again_s = time.perf_counter() - started
    print(f"forget(host=big.example): {forget_s:.2f} s, {len(gone):,} pages "
          f"({len(gone) / forget_s:,.0f}/s), {trips} round trips; pages held {held:,} -> "
          f"{left:,}; again: {again_s:.2f} s, {len(again)} pages")
    for name, e, f, a in (("index Redis", empty[0], full[0], after[0]),
                          ("records store", empty[1], full[1], after[1])):
        if f:
            print(f"{name}: used_memory {e:,} empty, {f:,} full, {a:,} after: freed "
                  f"{f - a:,} B ({(f - a) / max(len(gone), 1):.0f} B a page forgotten; "
                  f"{(f - e) / (args.pages + args.other):.0f} B a page held)")
    print(f"namespaces after: {index.namespaces()}")
    index.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
