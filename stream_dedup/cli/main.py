"""`stream-dedup replay | serve | index | curve | clusters | report | sample`: parse arguments
-> Settings -> run (the settings' flags: cli/settings.py; `index`: cli/index.py; `report`:
cli/report.py)."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import gc
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from stream_dedup.cli.index import add_parser as add_index_parser
from stream_dedup.cli.report import add_parser as add_report_parser
from stream_dedup.cli.settings import setting_flags, settings_of
from stream_dedup.config import Settings
from stream_dedup.errors import ConfigError, StreamDedupError
from stream_dedup.runner.signals import SIGNALS
from stream_dedup.security import kafka_security
from stream_dedup.version import __version__
from stream_dedup.workers.heap import keep_heap
from stream_dedup.workers.table_cache import load_tables

if TYPE_CHECKING:
    from stream_dedup.metrics import Metrics
    from stream_dedup.pipeline.deduplicator import Deduplicator

EPILOG_REPLAY = """\
examples:
  stream-dedup sample demo/                      # build a synthetic crawl to try it on
  stream-dedup replay demo/sample.warc.gz demo/sample.jsonl -o decisions.jsonl
  stream-dedup replay crawl-*.warc.gz --workers 2 --summary-json summary.json -o -
  stream-dedup replay pages.jsonl --verify-rate 0.1 --boilerplate -o out.jsonl
  stream-dedup replay crawl.warc.gz -o d.jsonl --report report.html   # + an HTML page

inputs: WARC and ARC files (gzipped or not) and JSONL pages, one object a line:
  {"url": ..., "html": "<html>..."}  or  {"url": ..., "body_b64": "..."}
  optional: "fetched_at", "status", "headers" ({"Content-Type": ...}).
Only HTTP responses with an HTML content type are pages; other records are skipped and
counted. A bad record or line becomes a "reject" decision; the replay goes on.

every setting can also come from the environment (STREAM_DEDUP_<NAME>, e.g.
STREAM_DEDUP_VERIFY_RATE=0.5) or a TOML file (--config); flags win over both.

exit status: 0 done; 1 some inputs could not be read (named in the summary; see
--allow-bad-inputs); 2 a usage error or a missing input, before anything was decided.
A file given twice (same path, overlapping globs, a symlink) is read once.
"""


EPILOG_SERVE = """\
examples:
  deploy/kafka-local start                     # a local broker on 127.0.0.1:9092
  stream-dedup serve --input-topic pages --kept-topic pages-kept
  STREAM_DEDUP_BOOTSTRAP_SERVERS=kafka:9092 stream-dedup serve --workers 2
  stream-dedup replay crawl.warc.gz --to-kafka pages      # feed it captured pages
  stream-dedup replay crawl.warc.gz --to-kafka pages-warc --to-kafka-format warc
                                               # ... its records, for --input-format warc
  kcat -C -b 127.0.0.1:9092 -t decisions -e             # read the decisions

message formats (--input-format):
  json  value = {"url": ..., "html": ...} or {"url": ..., "body_b64": ...} (+ fetched_at,
        status, headers); key ignored
  html  value = the HTML bytes; key = the URL; Kafka headers content-type, fetched-at,
        status carry the metadata
  warc  value = one WARC record, plain or one gzip member (response and resource records
        are pages, revisits recrawls; request, metadata, warcinfo... are skipped, counted
        in stream_dedup_skipped_records_total); key ignored
  scrapy-cluster  value = Scrapy Cluster's crawled_firehose JSON, as its KafkaPipeline
        sends it (base64 bodies: add --json-fields body_b64=body)
  any other JSON: --input-format json --json-fields url=link,html=content,status=code
  stream-dedup serve --input-format scrapy-cluster --input-topic demo.crawled_firehose \\
      --carry-fields crawlid,appid       # decisions then hold "carried": {"crawlid": ..}
SIGTERM/SIGINT: stop fetching, finish and commit the batch in flight, exit 0.

HTTP API (--http-port, default 8080 on 127.0.0.1; 0 = off):
  curl -s 127.0.0.1:8080/metrics | grep stream_dedup_pages_total
  curl -s 127.0.0.1:8080/readyz
  curl -s -H 'Content-Type: text/html' --data-binary @page.html \
       '127.0.0.1:8080/v1/check?url=https://a.example/'      # would-be decision, not stored
  STREAM_DEDUP_HTTP_TOKEN=secret stream-dedup serve           # /v1/* then need the token:
  curl -s -H 'Authorization: Bearer secret' 127.0.0.1:8080/v1/stats
"""


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # `kill -USR1 <pid>`: every thread's stack on stderr, the process goes on (where is a
    # stuck run waiting?)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def _serve(args: argparse.Namespace) -> int:
    from stream_dedup.kafka.service import serve
    from stream_dedup.runner.edges import Faults

    _logging(args.log_level)
    load_tables()
    faults = Faults.parse(args.crash_at, exit=True) if args.crash_at else None
    settings = settings_of(args)
    kafka_security(settings)  # settings that do not agree: one line, before connecting
    _settle_gc()
    if SIGNALS.first is not None:  # installed by the package's import (runner/signals.py)
        return 0
    return asyncio.run(serve(settings, faults=faults))


def _settle_gc() -> None:
    """For a long run: what exists at the start (modules, tables, an index) lives as long as
    the process, so the collector stops scanning it (gc.freeze: each full collection went
    over ~37,000 such objects, ~10 ms); and it runs after 50,000 net new container objects
    instead of 700, past the thousands a batch of 500 pages holds until it is decided (which
    it scanned several times a batch, each time to find them alive). Together: ~50 -> ~5 ms
    of collection a 6,000-page replay (bench/RESULTS.md)."""
    gc.freeze()
    gc.set_threshold(50_000, 10, 10)


def _writable(path: str | None, flag: str) -> None:
    """Fail before any work if an output file cannot be created where it is asked for."""
    if path and path != "-" and not Path(path).absolute().parent.is_dir():
        raise ConfigError(f"{flag} {path}: the directory {Path(path).parent} does not exist")


def _bad_inputs(unreadable: Sequence[str], allowed: bool) -> int:
    """The exit status a replay's unreadable inputs call for (they are named already)."""
    if not unreadable or allowed:
        return 0
    print(f"stream-dedup: {len(unreadable)} input(s) could not be read (named above); "
          "exit status 1 (--allow-bad-inputs accepts them)", file=sys.stderr)
    return 1


def _replay(args: argparse.Namespace) -> int:
    from stream_dedup.cli.report import run_settings, write_report
    from stream_dedup.replay.run import replay
    from stream_dedup.sinks.files import JsonlSink

    settings = settings_of(args)
    if args.to_kafka and args.output:
        raise ConfigError("-o/--output and --to-kafka exclude each other: --to-kafka sends "
                          "the pages to Kafka for `serve` to decide, and writes no decisions")
    if not args.to_kafka and not args.output:
        raise ConfigError("replay needs -o/--output FILE (or --to-kafka TOPIC)")
    if args.to_kafka_format != "json" and not args.to_kafka:
        raise ConfigError("--to-kafka-format says how --to-kafka sends: it needs --to-kafka")
    if args.report and (args.to_kafka or args.output == "-"):
        raise ConfigError("--report reads the decisions back from -o FILE: give a file")
    for path, flag in ((args.output, "-o"), (args.dead_letter, "--dead-letter"),
                       (args.summary_json, "--summary-json"), (args.report, "--report")):
        _writable(path, flag)
    missing = [p for p in args.inputs if not Path(p).exists()]
    if missing and not args.allow_bad_inputs:
        print(f"stream-dedup: no such input file(s): {', '.join(missing)} (a glob that "
              "matched nothing?); --allow-bad-inputs goes on without them", file=sys.stderr)
        return 2
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    if args.to_kafka:
        from stream_dedup.kafka.service import push

        kafka_security(settings)

        _logging("info")
        stats = asyncio.run(push(settings, args.to_kafka, args.inputs, progress,
                                 records=args.to_kafka_format == "warc"))
        for why in stats.unreadable:
            print(f"stream-dedup: unreadable input: {why}", file=sys.stderr)
        return _bad_inputs(stats.unreadable, args.allow_bad_inputs)
    from stream_dedup.pipeline.deduplicator import Deduplicator

    load_tables()
    metrics = None
    if args.http_port:
        from stream_dedup.metrics import Metrics

        metrics = Metrics(settings)
    dedup = Deduplicator(settings, observer=metrics)  # opens (and checks) the index first
    _settle_gc()
    try:
        dead = open(args.dead_letter, "w", encoding="utf-8") if args.dead_letter else None  # noqa: SIM115
        try:
            with _replay_http(settings, args.http_port, dedup, metrics):
                summary = replay(args.inputs, JsonlSink(args.output), settings, dedup=dedup,
                                 metrics=metrics, workers=settings.workers, dead_letter=dead,
                                 progress=progress, pin=args.pin)
        finally:
            if dead is not None:
                dead.close()
    finally:
        dedup.close()
    if not args.quiet:
        print(summary.render(), file=sys.stderr)
    elif summary.unreadable:
        print("\n".join(f"stream-dedup: unreadable input: {why}" for why in summary.unreadable),
              file=sys.stderr)
    done = {**summary.to_dict(), "settings": run_settings(settings)}
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(done, indent=2) + "\n")
    if args.report:
        write_report(args.output, args.inputs, Path(args.report), run_info=done,
                     boilerplate=settings.boilerplate)
    return _bad_inputs(summary.unreadable, args.allow_bad_inputs)


@contextmanager
def _replay_http(
    settings: Settings, port: int | None, dedup: Deduplicator, metrics: Metrics | None
) -> Iterator[None]:
    """With --http-port: the API (metrics, /v1/check ...) served while replay runs."""
    if not port or metrics is None:
        yield
        return
    from stream_dedup.http.app import ApiState, build_app
    from stream_dedup.http.thread import BackgroundServer

    app = build_app(ApiState(settings, metrics, dedup))
    with BackgroundServer(app, settings.http_host, port):
        print(f"stream-dedup: HTTP API on http://{settings.http_host}:{port}", file=sys.stderr)
        yield


def _curve(args: argparse.Namespace) -> int:
    from stream_dedup.cli.curve import print_curve

    return print_curve(args.groups, args.group_size, args.threshold, args.points, args.low,
                       args.high, args.png)


def _clusters(args: argparse.Namespace) -> int:
    from stream_dedup.cli.clusters import check_inputs, summarize

    missing = check_inputs(args.decisions)
    if missing:
        print(f"stream-dedup: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    summary = summarize(args.decisions, args.csv)
    print(summary.render(args.top))
    return 1 if summary.unreadable else 0


def _sample(args: argparse.Namespace) -> int:
    from stream_dedup.cli.sample import write_sample

    warc, jsonl, pages = write_sample(Path(args.directory), seed=args.seed)
    print(f"wrote {warc} and {jsonl} ({len(pages)} pages, plus non-HTML and broken records)")
    print(f"try:  stream-dedup replay {warc} {jsonl} -o decisions.jsonl")
    return 0


class Parser(argparse.ArgumentParser):
    """No abbreviated flags (subcommands' parsers are of this class too): `--redis-password
    X` must not be read as --redis-password-file, whose error would print X."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> NoReturn:
        # "unrecognized arguments" lists them: not the value of a would-be secret flag
        super().error(re.sub(r"(--[\w-]*(?:password|token)[\w-]*)(?:=|\s+)\S+", r"\1 ***",
                             message))


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    rp.add_argument("--to-kafka-format", choices=["json", "warc"], default="json",
                    help="with --to-kafka: json page messages, or warc: every record of "
                    "each WARC file as it is stored (its gzip member), one a message, keyed "
                    "by its target URI, for `serve --input-format warc`")
    rp.add_argument("--dead-letter", metavar="FILE",
                    help="also write rejected inputs (error + original bytes) as JSON lines")
    rp.add_argument("--summary-json", metavar="FILE", help="write the summary as JSON too")
    rp.add_argument("--report", metavar="FILE", help="then write the HTML report of the "
                    "decisions and these crawls (as `stream-dedup report`)")
    rp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bar on stderr (default: when stderr is a terminal)")
    rp.add_argument("--allow-bad-inputs", "--keep-going", action="store_true",
                    help="accept inputs that cannot be read (missing, a directory, empty, "
                    "not a crawl): each is an unreadable-file reject and named in the "
                    "summary, and the exit status is 0. Without it a missing input stops "
                    "replay before it starts (exit 2), and any other unreadable one makes "
                    "it exit 1 at the end")
    rp.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                    help="when --workers N is as many as the CPUs this process may use "
                    "(all, or what taskset or a cgroup gives it), run each process on a "
                    "CPU of its own: left to the kernel, this process's threads, which take "
                    "turns at one GIL, wake on the CPU a worker runs on. --no-pin: the "
                    "kernel places them (default: on)")
    rp.add_argument("-q", "--quiet", action="store_true", help="no summary on stderr")
    setting_flags(rp, serve=False)
    rp.set_defaults(func=_replay)

    sv = sub.add_parser("serve", help="the Kafka service: pages topic in, decisions out",
                        description="Consume crawled pages from a Kafka topic, decide each, "
                        "and produce decisions (plus kept pages and dead letters). "
                        "At-least-once: offsets are committed only after every output of a "
                        "batch is acknowledged by the broker.",
                        epilog=EPILOG_SERVE, formatter_class=argparse.RawDescriptionHelpFormatter)
    sv.add_argument("--log-level", default="info",
                    choices=["debug", "info", "warning", "error"],
                    help="how much the service logs (default info)")
    # Crash tests only: exit at once (code 70, nothing cleaned up) at a kill point of the
    # runner (edges.KILL_POINTS), e.g. --crash-at before-index-commit:3 (the third batch);
    # POINT:BATCH:SECONDS stalls there that long instead (the event loop blocked).
    sv.add_argument("--crash-at", metavar="POINT[:BATCH]", help=argparse.SUPPRESS)
    setting_flags(sv, serve=True)
    sv.set_defaults(func=_serve)

    add_index_parser(sub)
    add_report_parser(sub)

    cp = sub.add_parser("curve", help="print (or plot) the filter's acceptance curve P_{k,s,r}",
                        description="The probability that two pages of resemblance rho share "
                        "at least r of k features of s min-hashes (Broder 2000).")
    cp.add_argument("-k", "--groups", type=int, default=6, help="features per page (6)")
    cp.add_argument("-s", "--group-size", type=int, default=14, help="min-hashes a feature (14)")
    cp.add_argument("-r", "--threshold", type=int, default=2, help="shared features needed (2)")
    cp.add_argument("--points", type=int, default=21, help="rows in the table (21)")
    cp.add_argument("--low", type=float, default=0.5,
                    help="smallest rho in the table and the plot (0.5)")
    cp.add_argument("--high", type=float, default=1.0,
                    help="largest rho in the table and the plot (1.0)")
    cp.add_argument("--png", metavar="FILE", help="also plot the curve to a PNG")
    cp.set_defaults(func=_curve)

    kp = sub.add_parser("clusters", help="the clusters a run's decisions name: sizes, the "
                        "largest, one row per page with --csv",
                        description="Every kept page is its cluster's representative; every "
                        "page dropped against it (exact, canonical, near, near-verified, "
                        "contained) or unchanged at its URL joins it (a decision's `cluster` "
                        "field). Reads decisions as JSON lines (replay -o, or the decisions "
                        "topic, e.g. kcat -C -e -t decisions > d.jsonl) and prints how many "
                        "clusters, a size histogram and the largest with their "
                        "representatives' URLs.",
                        epilog="examples:\n  stream-dedup replay crawl.warc.gz -o d.jsonl && "
                        "stream-dedup clusters d.jsonl\n  stream-dedup clusters day1.jsonl "
                        "day2.jsonl --top 20 --csv pages.csv",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    kp.add_argument("decisions", nargs="+", metavar="FILE",
                    help="decisions, JSON lines ('-' for stdin), in the order they were made")
    kp.add_argument("--top", type=int, default=10, help="largest clusters listed (10)")
    kp.add_argument("--csv", metavar="FILE", help="also write one row per page: source, url, "
                    "decision, reason, page_id, cluster, cluster_url")
    kp.set_defaults(func=_clusters)

    sp = sub.add_parser("sample", help="write a synthetic crawl (WARC + JSONL) to try replay on")
    sp.add_argument("directory", help="where to write sample.warc.gz and sample.jsonl")
    sp.add_argument("--seed", type=int, default=7)
    sp.set_defaults(func=_sample)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    keep_heap()
    try:
        return int(args.func(args))
    except StreamDedupError as exc:
        print(f"stream-dedup: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stream-dedup: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Whoever read the output went away (`replay ... -o - | head`): stop quietly, as
        # `cat` does, with the status of a SIGPIPE; stdout now leads nowhere, so that the
        # interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
