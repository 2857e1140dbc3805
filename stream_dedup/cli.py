"""`stream-dedup replay | curve | sample`: parse arguments -> Settings -> run."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__
from .config import Settings
from .core import theory
from .core.sketch import FAMILIES
from .errors import StreamDedupError

if TYPE_CHECKING:
    from .metrics import Metrics
    from .pipeline import Deduplicator

EPILOG_REPLAY = """\
examples:
  stream-dedup sample demo/                      # build a synthetic crawl to try it on
  stream-dedup replay demo/sample.warc.gz demo/sample.jsonl -o decisions.jsonl
  stream-dedup replay crawl-*.warc.gz --workers 2 --summary-json summary.json -o -
  stream-dedup replay pages.jsonl --verify-rate 0.1 --boilerplate -o out.jsonl

inputs: WARC and ARC files (gzipped or not) and JSONL pages, one object a line:
  {"url": ..., "html": "<html>..."}  or  {"url": ..., "body_b64": "..."}
  optional: "fetched_at", "status", "headers" ({"Content-Type": ...}).
Only HTTP responses with an HTML content type are pages; other records are skipped and
counted. A bad record or line becomes a "reject" decision; the replay goes on.

every setting can also come from the environment (STREAM_DEDUP_<NAME>, e.g.
STREAM_DEDUP_VERIFY_RATE=0.5) or a TOML file (--config); flags win over both.
"""


EPILOG_SERVE = """\
examples:
  deploy/kafka-local start                     # a local broker on 127.0.0.1:9092
  stream-dedup serve --input-topic pages --kept-topic pages-kept
  STREAM_DEDUP_BOOTSTRAP_SERVERS=kafka:9092 stream-dedup serve --workers 2
  stream-dedup replay crawl.warc.gz --to-kafka pages      # feed it captured pages
  kcat -C -b 127.0.0.1:9092 -t decisions -e             # read the decisions

message formats (--input-format):
  json  value = {"url": ..., "html": ...} or {"url": ..., "body_b64": ...} (+ fetched_at,
        status, headers); key ignored
  html  value = the HTML bytes; key = the URL; Kafka headers content-type, fetched-at,
        status carry the metadata
SIGTERM/SIGINT: stop fetching, finish and commit the batch in flight, exit 0.

HTTP API (--http-port, default 8080 on 127.0.0.1; 0 = off):
  curl -s 127.0.0.1:8080/metrics | grep stream_dedup_pages_total
  curl -s 127.0.0.1:8080/readyz
  curl -s -H 'Content-Type: text/html' --data-binary @page.html \
       '127.0.0.1:8080/v1/check?url=https://a.example/'      # would-be decision, not stored
  STREAM_DEDUP_HTTP_TOKEN=secret stream-dedup serve           # /v1/* then need the token:
  curl -s -H 'Authorization: Bearer secret' 127.0.0.1:8080/v1/stats
"""


def _engine_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("filter (defaults: Broder's 6 features of 14 min-hashes, r=2)")
    g.add_argument("--config", metavar="FILE", help="TOML file with settings")
    g.add_argument("--shingle-words", type=int, metavar="W",
                   help="words per shingle (default 8)")
    g.add_argument("--groups", type=int, metavar="K", help="features per page (default 6)")
    g.add_argument("--group-size", type=int, metavar="S",
                   help="min-hashes per feature (default 14)")
    g.add_argument("--threshold", type=int, metavar="R",
                   help="shared features that make a near-duplicate (default 2)")
    g.add_argument("--seed", type=lambda v: int(v, 0), help="seed of the hash permutations")
    g.add_argument("--hash-family", choices=list(FAMILIES),
                   help="min-hash permutation family (default affine32: 32-bit multiply-add, "
                        "half the cost of affine64; mix64: full avalanche, ~3x affine64)")
    g.add_argument("--boilerplate", action="store_true", default=None,
                   help="drop navigation, headers, footers and link lists before hashing")
    g.add_argument("--min-shingles", type=int, metavar="N",
                   help="pages with fewer shingles use only the exact layers (default 25)")
    g.add_argument("--max-page-bytes", type=int, metavar="N",
                   help="reject larger pages (default 8 MiB). serve: a kept page larger than "
                        "the kept topic's max.message.bytes (Kafka's default ~1 MiB) goes "
                        "there as a reference to its input offset; it says so at start")
    v = parser.add_argument_group("verification of near-duplicate candidates")
    v.add_argument("--verify-rate", type=float, metavar="P",
                   help="share of candidates verified, 0..1 (default 1.0)")
    v.add_argument("--verify-min-resemblance", type=float, metavar="X",
                   help="full-sketch resemblance needed to confirm (default 0.80)")
    v.add_argument("--verify-max-ld-ratio", type=float, metavar="X",
                   help="estimated Levenshtein distance / length allowed (default 0.20)")
    v.add_argument("--ld-c", type=int, metavar="C", help="LD signature compression (default 32)")
    v.add_argument("--ld-n", type=int, metavar="N", help="LD signature window (default 4)")


def _index_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("index (what the filter remembers)")
    g.add_argument("--index", choices=["memory", "lsm", "redis"],
                   help="memory (default; gone on exit), lsm (RocksDB on disk; restarts "
                   "and crashes are invisible in the decisions) or redis (shared: every "
                   "instance on the same Redis decides as one; see README, Scale-out)")
    g.add_argument("--index-path", metavar="DIR", help="the LSM index directory")
    g.add_argument("--redis-url", metavar="URL",
                   help="redis: any node of a Redis Cluster (the rest is discovered) or a "
                   "single Redis or Kvrocks, e.g. redis://127.0.0.1:7000; several seeds "
                   "comma-separated, so a start does not depend on one node")
    g.add_argument("--warm-from", metavar="DIR",
                   help="start a memory index with the pages of an LSM index (a snapshot)")
    g.add_argument("--retention-days", type=float, metavar="DAYS",
                   help="lsm, redis: forget pages crawled more than DAYS ago, while running "
                   "(0 = never)")


def _kafka_flags(parser: argparse.ArgumentParser, *, serve: bool) -> None:
    g = parser.add_argument_group(
        "Kafka (env STREAM_DEDUP_<NAME>, e.g. STREAM_DEDUP_BOOTSTRAP_SERVERS)")
    g.add_argument("--bootstrap-servers", metavar="HOST:PORT[,..]",
                   help="Kafka brokers (default 127.0.0.1:9092)")
    if not serve:
        return
    g.add_argument("--input-topic", metavar="TOPIC", help="crawled pages in (default pages)")
    g.add_argument("--decisions-topic", metavar="TOPIC",
                   help="one decision per page, keyed by URL (default decisions)")
    g.add_argument("--kept-topic", metavar="TOPIC",
                   help="forward the original message of every kept page here (default off)")
    g.add_argument("--dead-letter-topic", metavar="TOPIC",
                   help="original bytes + error headers of bad input (default pages-dead-letter)")
    g.add_argument("--group-id", metavar="ID", help="consumer group (default stream-dedup)")
    g.add_argument("--input-format", choices=["json", "html"],
                   help="json: value is a page object; html: value is HTML, key is the URL, "
                   "metadata in headers (default json)")
    g.add_argument("--batch-size", type=int, metavar="N",
                   help="records decided and committed together (default 500)")
    g.add_argument("--workers", type=int, metavar="N",
                   help="cores for parsing and sketching: the deciding thread and "
                   "N-1 worker processes (default 1)")


def _http_flags(parser: argparse.ArgumentParser, *, serve: bool) -> None:
    g = parser.add_argument_group(
        "HTTP API (/metrics, /healthz, /readyz, /v1/check, /v1/stats; bearer token for /v1/* "
        "from STREAM_DEDUP_HTTP_TOKEN)")
    g.add_argument("--http-host", metavar="ADDR",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 in a container)")
    g.add_argument("--http-port", type=int, metavar="PORT",
                   help="port to listen on, 0 = off (default 8080)" if serve else
                   "serve the HTTP API on PORT while replaying (default: off)")
    if serve:
        g.add_argument("--stall-seconds", type=float, metavar="S",
                       help="/readyz fails when records wait and no batch finished for S "
                       "seconds (default 120)")


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name, None) for name in Settings.names()}
    return Settings.load(config_file=args.config, overrides=overrides)


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _serve(args: argparse.Namespace) -> int:
    from .edges import Faults
    from .service import serve

    _logging(args.log_level)
    faults = Faults.parse(args.crash_at, exit=True) if args.crash_at else None
    return asyncio.run(serve(_settings(args), faults=faults))


def _replay(args: argparse.Namespace) -> int:
    from .replay import replay
    from .sinks import JsonlSink

    settings = _settings(args)
    missing = [p for p in args.inputs if not Path(p).exists()]
    if missing and not args.keep_going:
        print(f"stream-dedup: no such input file(s): {', '.join(missing)}", file=sys.stderr)
        return 2
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    if args.to_kafka:
        from .service import push

        _logging("info")
        return asyncio.run(push(settings, args.to_kafka, args.inputs, progress))
    if not args.output:
        print("stream-dedup: replay needs -o/--output FILE (or --to-kafka TOPIC)",
              file=sys.stderr)
        return 2
    from .pipeline import Deduplicator

    metrics = None
    if args.http_port:
        from .metrics import Metrics

        metrics = Metrics(settings)
    dedup = Deduplicator(settings, observer=metrics)  # opens (and checks) the index first
    try:
        dead = open(args.dead_letter, "w", encoding="utf-8") if args.dead_letter else None  # noqa: SIM115
        try:
            with _replay_http(settings, args.http_port, dedup, metrics):
                summary = replay(args.inputs, JsonlSink(args.output), settings, dedup=dedup,
                                 metrics=metrics, workers=settings.workers, dead_letter=dead,
                                 progress=progress)
        finally:
            if dead is not None:
                dead.close()
    finally:
        dedup.close()
    if not args.quiet:
        print(summary.render(), file=sys.stderr)
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
    return 0


@contextmanager
def _replay_http(
    settings: Settings, port: int | None, dedup: Deduplicator, metrics: Metrics | None
) -> Iterator[None]:
    """With --http-port: the API (metrics, /v1/check ...) served while replay runs."""
    if not port or metrics is None:
        yield
        return
    from .http.app import ApiState, build_app
    from .http.thread import BackgroundServer

    app = build_app(ApiState(settings, metrics, dedup))
    with BackgroundServer(app, settings.http_host, port):
        print(f"stream-dedup: HTTP API on http://{settings.http_host}:{port}", file=sys.stderr)
        yield


def _index(args: argparse.Namespace) -> int:
    from .index.lsm import LsmIndex

    index = LsmIndex(args.index_path, stamp=None, create=False)
    try:
        if args.action == "stats":
            print(json.dumps({**index.stats(), "stamp": f"{index.stamp:#x}",
                              "offsets": index.offsets()}, indent=2))
        elif args.action == "compact":
            before = index.stats()["disk_bytes"]
            index.compact()
            print(f"compacted {args.index_path}: {before:,.0f} -> "
                  f"{index.stats()['disk_bytes']:,.0f} bytes", file=sys.stderr)
        else:
            if not args.target:
                print("stream-dedup: index export needs a target DIR", file=sys.stderr)
                return 2
            index.export(args.target)
            print(f"exported a consistent copy of {args.index_path} to {args.target}",
                  file=sys.stderr)
    finally:
        index.close()
    return 0


def _curve(args: argparse.Namespace) -> int:
    k, s, r = args.groups, args.group_size, args.threshold
    rows = theory.curve(k, s, r, points=args.points, lo=args.low, hi=args.high)
    print(f"P_{{{k},{s},{r}}}(rho): probability that pages of resemblance rho share >= {r} "
          f"of {k} features of {s} min-hashes")
    print(f"50% point rho = {theory.half_point(k, s, r):.4f}; steepest for s={s} at "
          f"rho = {theory.steepest_point(s):.4f}")
    print(f"{'rho':>6}  {'P(drop)':>10}")
    for rho, p in rows:
        print(f"{rho:6.3f}  {p:10.6f}  {'#' * round(p * 40)}")
    if args.png:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("stream-dedup: --png needs matplotlib (pip install 'stream-dedup[plot]')",
                  file=sys.stderr)
            return 2
        fine = theory.curve(k, s, r, points=401)
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([x for x, _ in fine], [y for _, y in fine])
        ax.axvline(theory.half_point(k, s, r), ls=":", c="gray")
        ax.set(xlabel="resemblance rho", ylabel="P(share >= r features)",
               title=f"P_{{{k},{s},{r}}}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(args.png, dpi=120)
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


def _sample(args: argparse.Namespace) -> int:
    from .sample import write_sample

    warc, jsonl, pages = write_sample(Path(args.directory), seed=args.seed)
    print(f"wrote {warc} and {jsonl} ({len(pages)} pages, plus non-HTML and broken records)")
    print(f"try:  stream-dedup replay {warc} {jsonl} -o decisions.jsonl")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stream-dedup",
        description="Streaming near-duplicate filter for web crawls: keep or drop every page "
        "(exact copy, same text, or near-duplicate of a page seen before) and say why.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rp = sub.add_parser("replay", help="decide every page of captured crawls (WARC/ARC/JSONL)",
                        description="Replay captured crawls through the dedup pipeline and "
                        "write one JSON decision per input page, in input order.",
                        epilog=EPILOG_REPLAY, formatter_class=argparse.RawDescriptionHelpFormatter)
    rp.add_argument("inputs", nargs="+", metavar="FILE", help="WARC/ARC/JSONL files, in order")
    rp.add_argument("-o", "--output", metavar="FILE",
                    help="decisions as JSON lines ('-' for stdout)")
    rp.add_argument("--to-kafka", metavar="TOPIC",
                    help="instead of deciding, push the pages into TOPIC as JSON page "
                    "messages (keyed by URL) for a running `serve`")
    rp.add_argument("--dead-letter", metavar="FILE",
                    help="also write rejected inputs (error + original bytes) as JSON lines")
    rp.add_argument("--summary-json", metavar="FILE", help="write the summary as JSON too")
    rp.add_argument("--workers", type=int, metavar="N",
                    help="cores for parsing and sketching: the deciding thread and "
                    "N-1 worker processes (default 1)")
    rp.add_argument("--batch-size", type=int, metavar="N",
                    help="pages decided and written together (default 500)")
    rp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar on stderr (default: when stderr is a terminal)")
    rp.add_argument("--keep-going", action="store_true",
                    help="treat missing input files as rejects instead of exiting with 2")
    rp.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    _engine_flags(rp)
    _kafka_flags(rp, serve=False)
    _http_flags(rp, serve=False)
    _index_flags(rp)
    rp.set_defaults(func=_replay)

    sv = sub.add_parser("serve", help="the Kafka service: pages topic in, decisions out",
                        description="Consume crawled pages from a Kafka topic, decide each, "
                        "and produce decisions (plus kept pages and dead letters). "
                        "At-least-once: offsets are committed only after every output of a "
                        "batch is acknowledged by the broker.",
                        epilog=EPILOG_SERVE, formatter_class=argparse.RawDescriptionHelpFormatter)
    _kafka_flags(sv, serve=True)
    _http_flags(sv, serve=True)
    sv.add_argument("--log-level", default="info",
                    choices=["debug", "info", "warning", "error"])
    # Crash tests only: exit at once (code 70, nothing cleaned up) at a kill point of the
    # runner (edges.KILL_POINTS), e.g. --crash-at before-index-commit:3 (the third batch).
    sv.add_argument("--crash-at", metavar="POINT[:BATCH]", help=argparse.SUPPRESS)
    _engine_flags(sv)
    _index_flags(sv)
    sv.set_defaults(func=_serve)

    ip = sub.add_parser("index", help="inspect or maintain an LSM index: stats, compact, export",
                        description="Operator commands on a persistent (--index lsm) index. "
                        "Run them while no service holds the index (RocksDB locks it).",
                        epilog="examples:\n  stream-dedup index stats --index-path /var/lib/sd\n"
                        "  stream-dedup index compact --index-path /var/lib/sd\n"
                        "  stream-dedup index export /backup/sd-2026-11-21 --index-path "
                        "/var/lib/sd", formatter_class=argparse.RawDescriptionHelpFormatter)
    ip.add_argument("action", choices=["stats", "compact", "export"],
                    help="stats: pages, bytes, offsets as JSON; compact: merge files; "
                    "export DIR: a consistent copy (also a snapshot --warm-from can load)")
    ip.add_argument("target", nargs="?", metavar="DIR", help="export: where the copy goes")
    ip.add_argument("--index-path", required=True, metavar="DIR", help="the index directory")
    ip.set_defaults(func=_index)

    cp = sub.add_parser("curve", help="print (or plot) the filter's acceptance curve P_{k,s,r}",
                        description="The probability that two pages of resemblance rho share "
                        "at least r of k features of s min-hashes (Broder 2000).")
    cp.add_argument("-k", "--groups", type=int, default=6, help="features per page (6)")
    cp.add_argument("-s", "--group-size", type=int, default=14, help="min-hashes a feature (14)")
    cp.add_argument("-r", "--threshold", type=int, default=2, help="shared features needed (2)")
    cp.add_argument("--points", type=int, default=21, help="rows in the table (21)")
    cp.add_argument("--low", type=float, default=0.5, help="smallest rho shown (0.5)")
    cp.add_argument("--high", type=float, default=1.0, help="largest rho shown (1.0)")
    cp.add_argument("--png", metavar="FILE", help="also plot the curve to a PNG")
    cp.set_defaults(func=_curve)

    sp = sub.add_parser("sample", help="write a synthetic crawl (WARC + JSONL) to try replay on")
    sp.add_argument("directory", help="where to write sample.warc.gz and sample.jsonl")
    sp.add_argument("--seed", type=int, default=7)
    sp.set_defaults(func=_sample)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except StreamDedupError as exc:
        print(f"stream-dedup: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stream-dedup: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
