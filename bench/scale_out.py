"""Scale-out benchmark: the Redis index against the memory index, and 1 vs 2 instances.

    python bench/scale_out.py --redis-url redis://127.0.0.1:7000 [--pages 4000] [--rounds 3]

The records (with their shingle sets) stay in the index's Redis here: with the defaults a
page has 16 set entries and a record ~10x larger than without exact verification.

The Redis must be empty and may be flushed (deploy/redis-local start /tmp/r gives one).
  1. Throughput, one instance: the same pages (../shared/corpora's httpbis + WARC pages, then
     a synthetic crawl) decided by the Deduplicator in batches of Settings.batch_size, on the
     memory index and on the Redis index, alternated for --rounds rounds (the machine is
     shared: ratios of medians). Pages are loaded first; parsing, sketching and deciding
     all count, as in a replay. Also: Redis round trips per batch, and that both backends
     gave the same decisions.
  2. The same through `stream-dedup replay` (fresh processes, alternated; the replay's own
     seconds: reading the files, deciding, writing), --index memory vs --index redis, on
     the corpora (WARC files + httpbis as JSONL) and the synthetic crawl as JSONL: what one
     instance does end to end, reading included (stage 1 leaves it out).
  3. Instances: the synthetic crawl split in two halves by page number (as two Kafka
     partitions would split it), decided by 1 process (both halves, one after the other)
     and by 2 processes at once, each on the same Redis; pages/s of all decided.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib
from benchlib import load_httpbis_pages, load_warc_pages, synthetic_pages

from stream_dedup import Settings
from stream_dedup.models import Decision, Page
from stream_dedup.pipeline.deduplicator import Deduplicator

sys.path.insert(0, str(benchlib.REPO / "tests"))
from indexkit import flush_redis  # noqa: E402
from workers import run_replay, write_jsonl  # noqa: E402


def decide(pages: list[Page], settings: Settings) -> tuple[float, list[Decision], float]:
    """Seconds to decide `pages`, the decisions, and Redis round trips per batch (0: none)."""
    dd = Deduplicator(settings)
    size = settings.batch_size
    started = time.perf_counter()
    out: list[Decision] = []
    for i in range(0, len(pages), size):
        out += dd.check_batch(pages[i : i + size])
    seconds = time.perf_counter() - started
    trips = getattr(dd.index, "round_trips", 0) / -(-len(pages) // size)
    dd.close()
    return seconds, out, trips


def same(a: list[Decision], b: list[Decision]) -> bool:
    def key(d: Decision) -> tuple[object, ...]:
        return d.url, d.decision, d.reason, d.duplicate_of and d.duplicate_of.url

    return [key(d) for d in a] == [key(d) for d in b]


def throughput(name: str, pages: list[Page], url: str, rounds: int) -> None:
    rates: dict[str, list[float]] = {"memory": [], "redis": []}
    trips = 0.0
    agree = True
    for _ in range(rounds):
        s_mem, d_mem, _ = decide(pages, Settings())
        flush_redis(url)
        s_red, d_red, trips = decide(pages, Settings(index="redis", redis_url=url))
        rates["memory"].append(len(pages) / s_mem)
        rates["redis"].append(len(pages) / s_red)
        agree = agree and same(d_mem, d_red)
    mem, red = statistics.median(rates["memory"]), statistics.median(rates["redis"])
    print(f"{name:<22} {len(pages):>7,} {mem:>12,.0f} {red:>12,.0f} {red / mem:>7.2f} "
          f"{trips:>12.1f} {'yes' if agree else 'NO':>10}", flush=True)


def replay_throughput(name: str, files: list[Path], url: str, rounds: int) -> None:
    """`replay` on the memory index against the Redis index, fresh processes, alternated."""
    size = Settings().batch_size
    rates: dict[str, list[float]] = {"memory": [], "redis": []}
    pages = 0
    for _ in range(rounds):
        seconds, _, pages = run_replay(files, 1, size)
        rates["memory"].append(pages / seconds)
        flush_redis(url)
        seconds, _, pages = run_replay(files, 1, size,
                                       extra=("--index", "redis", "--redis-url", url))
        rates["redis"].append(pages / seconds)
    mem, red = statistics.median(rates["memory"]), statistics.median(rates["redis"])
    each = ", ".join(f"{r / m:.2f}" for m, r in zip(rates["memory"], rates["redis"],
                                                     strict=True))
    print(f"{name:<22} {pages:>7,} {mem:>12,.0f} {red:>12,.0f} {red / mem:>7.2f}   "
          f"(each round: {each})", flush=True)


def instances(pages: int, url: str, rounds: int) -> None:
    """1 process deciding both halves vs 2 processes deciding one half each, at once."""
    def run(halves: list[list[int]]) -> float:
        flush_redis(url)
        started = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", url, str(pages),
                                   json.dumps(h)]) for h in halves]
        for p in procs:
            if p.wait() != 0:
                raise SystemExit("a worker failed")
        return pages / (time.perf_counter() - started)

    one, two = [], []
    for _ in range(rounds):
        one.append(run([[0, 1]]))
        two.append(run([[0], [1]]))
    a, b = statistics.median(one), statistics.median(two)
    print(f"1 instance  {a:>8,.0f} pages/s\n2 instances {b:>8,.0f} pages/s   ({b / a:.2f}x; "
          "process start-up included)", flush=True)


def worker(url: str, pages: int, halves: list[int]) -> None:
    crawl = synthetic_pages(pages)
    settings = Settings(index="redis", redis_url=url)
    dd = Deduplicator(settings)
    for half in halves:
        mine = [p for i, p in enumerate(crawl) if i % 2 == half]
        for i in range(0, len(mine), settings.batch_size):
            dd.check_batch(mine[i : i + settings.batch_size])
    dd.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:7000")
    parser.add_argument("--pages", type=int, default=4000, help="synthetic crawl size (4000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), json.loads(args.worker[2]))
        return 0
    print(benchlib.header("scale-out: Redis index vs memory index; 1 vs 2 instances"))
    print(f"{'input':<22} {'pages':>7} {'memory p/s':>12} {'redis p/s':>12} {'ratio':>7} "
          f"{'trips/batch':>12} {'same':>10}")
    warc, _ = load_warc_pages()
    httpbis, synthetic = load_httpbis_pages(), synthetic_pages(args.pages)
    throughput("httpbis + WARC", httpbis + warc, args.redis_url, args.rounds)
    throughput("synthetic crawl", synthetic, args.redis_url, args.rounds)
    print(f"\nreplay, end to end\n{'input':<22} {'pages':>7} {'memory p/s':>12} "
          f"{'redis p/s':>12} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        corpora = [*benchlib.warc_files(), write_jsonl(httpbis, Path(tmp) / "httpbis.jsonl")]
        replay_throughput("httpbis + WARC", corpora, args.redis_url, args.rounds)
        replay_throughput("synthetic crawl", [write_jsonl(synthetic, Path(tmp) / "syn.jsonl")],
                          args.redis_url, args.rounds)
    print()
    instances(args.pages, args.redis_url, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
