"""What a namespace costs the index: the same pages decided in the default namespace (A)
and in namespace "a" (B), rounds alternating A B A B, in one run, on each backend.

The pages are analysed once, before timing: a round times only what a namespace can
change, the index's lookups and claims and the decide step (`check_batch` with the
analyses given), on a fresh index each round. A namespace salts every key of a probe and
of a stored record (index/namespaces.py), so its index work is the default's: the ratio B/A is
expected within noise. C adds `--namespace-read ref` (a second, read-only lookup a page
against a reference namespace holding the same crawl's other half): what a read costs.

    python bench/namespaces.py --pages 4000 --rounds 5 --backends memory lsm redis \
        --redis-url redis://127.0.0.1:7100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from benchlib import header, synthetic_pages, table  # noqa: E402
from indexkit import flush_redis  # noqa: E402

from stream_dedup import Settings  # noqa: E402
from stream_dedup.pipeline.analysis import Analyzer  # noqa: E402
from stream_dedup.pipeline.deduplicator import Deduplicator  # noqa: E402

BATCH = 500


def _settings(backend: str, tmp: Path, redis_url: str, **more: str) -> Settings:
    if backend == "lsm":
        path = tempfile.mkdtemp(dir=tmp)
        return Settings(index="lsm", index_path=path, **more)
    if backend == "redis":
        flush_redis(redis_url)
        return Settings(index="redis", redis_url=redis_url, **more)
    return Settings(**more)


def _round(settings: Settings, pages: list, analyses: list, reference: int) -> float:
    """Pages a second through the index and the decide step (the first `reference` pages
    go into namespace "ref" untimed, for the read variant)."""
    dd = Deduplicator(settings)
    try:
        if reference:
            ref = Deduplicator(settings.replace(namespace="ref", namespace_read=""), dd.index)
            for i in range(0, reference, BATCH):
                ref.check_batch(pages[i : i + BATCH], redeliveries=False,
                                analysed=analyses[i : i + BATCH])
        started = time.perf_counter()
        for i in range(reference, len(pages), BATCH):
            dd.check_batch(pages[i : i + BATCH], redeliveries=False,
                           analysed=analyses[i : i + BATCH])
        return (len(pages) - reference) / (time.perf_counter() - started)
    finally:
        dd.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backends", nargs="+", default=["memory", "lsm"],
                    choices=["memory", "lsm", "redis"])
    ap.add_argument("--redis-url", default="")
    args = ap.parse_args()
    if "redis" in args.backends and not args.redis_url:
        ap.error("--backends redis needs --redis-url (a Redis this bench may FLUSHALL)")
    pages = synthetic_pages(args.pages, 8000, near_share=0.3)
    analyzer = Analyzer(Settings())
    analyses = [analyzer.analyze(p) for p in pages]
    half = len(pages) // 2
    variants = {"A default": ({}, 0), "B namespace a": ({"namespace": "a"}, 0),
                "C a, reading ref": ({"namespace": "a", "namespace_read": "ref"}, half)}
    print(header("Namespaces: index + decide pages/s, the default namespace (A) and a "
                 "namespace (B), alternating"))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in args.backends:
            rates: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, (more, reference) in variants.items():
                    settings = _settings(backend, Path(tmp), args.redis_url, **more)
                    rates[name].append(_round(settings, pages, analyses, reference))
            a = rates["A default"]
            for name, got in rates.items():
                ratios = [g / base for g, base in zip(got, a, strict=True)]
                rows.append([backend, name, statistics.median(got), min(ratios),
                             statistics.median(ratios), max(ratios)])
    print(table(["backend", "variant", "pages/s (median)", "ratio to A min", "median", "max"],
                rows))
    print(f"\n{args.pages} synthetic pages of ~8 KB (30% near-duplicates), batches of "
          f"{BATCH}, analysed before timing; {args.rounds} rounds; C times the second half "
          "of the pages, the first half held in namespace ref.")


if __name__ == "__main__":
    main()
