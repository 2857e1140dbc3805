"""Feature index benchmark: memory vs LSM vs Redis in one run, through the index seam.

For N pages (generated: --keys random 64-bit index keys, 15 by default: 6 features, 5
band keys and 4 stored containment keys, as the deduplicator's defaults give (the keys a
page only asks with, contain_query_keys beyond those, are not modelled); raw and canonical
fingerprints, a URL key (one URL per page; --no-url-keys: none), an 84-value sketch, a
200-byte LD signature, a 50-byte URL and a --shingle-bytes shingle set per page) it drives
each backend as the deduplicator does, per batch of --batch pages: one `lookup` (exact
layers and the keys' posting lists), then one `claim` of the batch (every page kept). It reports:
  - pages/s through the seam (index work only: no parsing, no deciding);
  - bytes per page: memory = the index structures (features + exact maps); LSM = the
    features column family on disk after a flush + compaction, and the whole directory
    (records included); Redis = `used_memory` (INFO memory, summed over the primaries)
    after minus before, divided by the pages: everything a page costs there;
  - Redis: pipelined round trips per batch; `redis+store` puts the verification records in
    another store (--redis-records-url, a single Redis here; Kvrocks on SSD in production):
    "index B/page" is then the index's Redis alone and "records B/page" the other store;
    and where a Redis page's bytes go: `MEMORY USAGE` of a sample of each kind of key
    (S: set buckets, P: record buckets, D: verification records) per page held.
A share of pages (--dup-share) reuses 3 features of an earlier page, so lookups find
candidates as they do on a real crawl.

Redis: URL is a node of a `deploy/redis-local` cluster; for the RAM figure start it with
Redis's default listpack settings
(`REDIS_LOCAL_EXTRA_CONFIG=$'hash-max-listpack-entries 128\\nhash-max-listpack-value 64'`).
URL2 (--redis-records-url) is a single `redis-server` here, Kvrocks on SSD in production.

    python bench/index_bench.py --pages 1000000 --backends memory lsm redis redis+store \
        --redis-url redis://127.0.0.1:7000 --redis-records-url redis://127.0.0.1:7999
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

from stream_dedup.index import FeatureIndex, MemoryIndex, StoredDoc
from stream_dedup.index.base import Claim, Probe
from stream_dedup.index.lsm import LsmIndex
from stream_dedup.index.redis.backend import RedisIndex
from stream_dedup.models import Decision

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from indexkit import flush_redis  # noqa: E402


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _used_memory(index: RedisIndex) -> tuple[int, int]:
    stats = index.stats()
    return int(stats["redis_used_memory"]), int(stats.get("records_used_memory", 0))


def _breakdown(clients: list, pages: int, every: int = 20) -> dict[str, float]:
    """Bytes per page held by kind of key (the letter after the hash tag), from MEMORY
    USAGE of every `every`-th key of every node."""
    import redis
    from redis.cluster import RedisCluster

    total: dict[str, float] = {}
    seen = 0
    for client in clients:
        nodes = ([redis.Redis(host=n.host, port=n.port) for n in client.get_primaries()]
                 if isinstance(client, RedisCluster) else [client])
        for node in nodes:
            for key in node.scan_iter(count=1000):
                if b"}" not in key:
                    continue
                seen += 1
                if seen % every:
                    continue
                kind = chr(key[key.index(b"}") + 1])
                total[kind] = total.get(kind, 0.0) + (node.memory_usage(key, samples=0) or 0)
    return {kind: b * every / pages for kind, b in sorted(total.items())}


def run(backend: str, pages: int, batch: int, dup_share: float, seed: int, tmp: Path,
        redis_url: str, records_url: str, keys: int, shingle_bytes: int,
        url_keys: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    features = rng.integers(0, 2**63, size=(pages, keys), dtype=np.uint64)
    urls = (rng.integers(1, 2**63, size=pages, dtype=np.uint64) if url_keys
            else np.zeros(pages, dtype=np.uint64)).tolist()
    dups = np.flatnonzero(rng.random(pages) < dup_share)
    dups = dups[dups > 0]
    sources = rng.integers(0, dups, dtype=np.int64) if dups.size else dups
    features[dups, :3] = features[sources, :3]
    sketches = rng.integers(0, 2**32, size=(4096, 84), dtype=np.uint32)  # realistic entropy
    signature = bytes(range(200))
    sets = rng.bytes(shingle_bytes + 4096)  # a page's set: a slice at its own offset
    index: FeatureIndex
    if backend.startswith("redis"):
        flush_redis(redis_url)
        store = records_url if backend == "redis+store" else ""
        if store:
            flush_redis(store)
        index = RedisIndex(redis_url, 1, records_url=store)
        before = _used_memory(index)
    elif backend == "lsm":
        index = LsmIndex(tmp / "lsm", 1)
    else:
        index = MemoryIndex(1)
    ids = index.local_ids(pages)
    found = 0
    started = time.perf_counter()
    for start in range(0, pages, batch):
        probes, docs = [], []
        for i in range(start, min(pages, start + batch)):
            feats = features[i]
            probes.append(Probe(ids[i], i, i + pages, feats, urls[i]))
            docs.append(StoredDoc(f"https://www.example-{i % 1000}.com/news/article/{i}.html",
                                  feats, sketches[i % 4096] ^ np.uint32(i), signature, 9000,
                                  i, i + pages, None, ids[i],
                                  sets[i % 4096 : i % 4096 + shingle_bytes], urls[i]))
        for answer in index.lookup(probes):
            found += sum(1 for posting in answer.postings if posting)
        index.claim([Claim(p, d, Decision(d.url, "keep", "unique", page_id=d.page_id))
                     for p, d in zip(probes, docs, strict=True)])
        index.commit({"bench/0": start + len(probes)})
    seconds = time.perf_counter() - started
    result = {"backend": backend, "pages": pages, "seconds": seconds,
              "pages_per_s": pages / seconds, "candidates_found": found,
              "index_bytes_per_page": float("nan"), "dir_bytes_per_page": float("nan"),
              "round_trips_per_batch": float("nan"), "records_bytes_per_page": float("nan"),
              "breakdown": {}}
    if isinstance(index, LsmIndex):
        index.compact()
        result["index_bytes_per_page"] = index.stats()["index_bytes_per_page"]
        index.close()
        result["dir_bytes_per_page"] = _dir_bytes(tmp / "lsm") / pages
    elif isinstance(index, RedisIndex):
        after = _used_memory(index)
        result["index_bytes_per_page"] = (after[0] - before[0]) / pages
        if index.records is not None:
            result["records_bytes_per_page"] = (after[1] - before[1]) / pages
        result["round_trips_per_batch"] = index.round_trips / -(-pages // batch)
        result["breakdown"] = _breakdown([c for c in (index.client, index.records) if c],
                                         pages)
        index.close()
    else:
        result["index_bytes_per_page"] = index.stats()["index_bytes_per_page"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--backends", nargs="+", default=["memory", "lsm"],
                        choices=["memory", "lsm", "redis", "redis+store"])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:7000",
                        help="redis: a node of an EMPTY Redis it may flush (deploy/redis-local)")
    parser.add_argument("--redis-records-url", default="redis://127.0.0.1:7999",
                        help="redis+store: another EMPTY Redis it may flush, for the records")
    parser.add_argument("--batch", type=int, default=500, help="pages per commit (500)")
    parser.add_argument("--dup-share", type=float, default=0.2)
    parser.add_argument("--tmp", default=None, help="where the LSM directory goes")
    parser.add_argument("--keys", type=int, default=15,
                        help="index keys a page: features + band keys + stored containment "
                        "keys (15 = 6 + 5 + 4, the defaults; 6 with --bands 0 "
                        "--contain-keys 0)")
    parser.add_argument("--no-url-keys", dest="url_keys", action="store_false",
                        help="pages without a URL key (before recrawls were indexed)")
    parser.add_argument("--shingle-bytes", type=int, default=4_416,
                        help="a record's shingle set, 4 B a shingle (4,416: the long WARC "
                        "pages' mean, sets sampled past 8,192 shingles; 7,644 whole; 0: "
                        "none, as with --no-verify-exact)")
    args = parser.parse_args()
    print(f"# {' '.join(sys.argv)}  (nproc={os.cpu_count()}, python {sys.version.split()[0]})")
    print(f"{'backend':<8} {'pages':>10} {'seconds':>9} {'pages/s':>10} "
          f"{'index B/page':>13} {'dir B/page':>11} {'records B/page':>15} "
          f"{'trips/batch':>12}  bytes a page by kind of key (Redis)")
    for pages in args.pages:
        for backend in args.backends:
            tmp = Path(tempfile.mkdtemp(dir=args.tmp))
            try:
                r = run(backend, pages, args.batch, args.dup_share, 7, tmp, args.redis_url,
                        args.redis_records_url, args.keys, args.shingle_bytes,
                        args.url_keys)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            kinds = "  ".join(f"{k} {b:.1f}" for k, b in r["breakdown"].items())
            print(f"{r['backend']:<8} {r['pages']:>10,} {r['seconds']:>9.1f} "
                  f"{r['pages_per_s']:>10,.0f} {r['index_bytes_per_page']:>13.1f} "
                  f"{r['dir_bytes_per_page']:>11.1f} {r['records_bytes_per_page']:>15.1f} "
                  f"{r['round_trips_per_batch']:>12.1f}  {kinds}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
