#!/usr/bin/env python3
"""`serve --exactly-once` against `serve` (at-least-once) on the same broker: what a Kafka
transaction a batch costs in throughput and in page-to-decision latency.

A script that prints figures, not a test. Target (the issue): exactly-once at >= 0.8x the
at-least-once throughput, and a p99 latency <= 2x, at 300 and 800 pages/s offered.

In one run it:

1. starts a broker of its own (deploy/kafka-local in a temporary directory, on two free
   ports below the ephemeral range; --bootstrap uses a running one instead), and at the
   end stops it and removes its data;
2. builds the pages once: `stream_dedup.cli.sample.build(seed)` for seeds 1, 2, ... (distinct
   articles ~15 kB, a fifth followed by an exact copy, a fifth by the same text in other
   markup, a fifth by a near-duplicate, and short stubs; a URL a seed repeats is kept
   once). Every service gets the same pages under URLs of its own (`http://<phase
   tag>.site<seed>.example.test/...`): no URL occurs twice in the whole run, so the
   recrawl rules never apply; each service starts with an empty memory index, so the
   same content in every phase gives the same decisions, not duplicates;
3. warms up (not counted): each mode once at the highest rate for --warm-up-seconds (a
   fresh broker's JVM spends ~3x the CPU a page until its code is compiled);
4. per round, per test, runs both modes one after the other (which goes first alternates
   between rounds), each as a fresh `python -m stream_dedup serve` of this checkout with
   fresh topics and group (the input topic with --partitions partitions, the others with
   one):
   - backlog: --backlog pages in the input topic before the service starts; throughput =
     pages / (the last decision visible to a read_committed reader - the service's first
     "partitions assigned" log line); also from the first decision seen (the steady rate);
   - rate R (each of --rates): the service started, assigned and warmed up (--warm-pages
     pages decided and visible), a producer offers R pages/s for --seconds. Latency of a
     page: "sent" = its decision's CreateTime - its CreateTime (the decision handed to
     the producer; exactly-once: before its transaction commits); "visible" = when a
     read_committed consumer, polling all along, received the decision - the page's
     CreateTime (what a downstream reader sees). Pages and decisions are matched by the
     decision's `source` (topic/partition/offset). The p50 of the first and of the last
     quarter of the pages sent tells whether the service kept up (a growing queue);
5. reads the service's /metrics before and after the timed window: batches
   (stream_dedup_batches_total: one offset commit, or one transaction, each),
   transactions (stream_dedup_kafka_transactions_total) and the commit histogram, i.e. the
   commit interval the rate gives; CPU seconds of the service, of the broker (/proc) and
   of this process (producer and reader) per 1,000 pages, and the host's CPU use;
6. prints per test and mode the median over the rounds and the range, the ratio
   exactly-once / at-least-once of the medians (and the range of the rounds' ratios), the
   targets met or not, the decision mix, decisions visible more than once, and every
   WARNING/ERROR line of the services' logs counted by mode (aborted transactions and
   "starting over" included).

Reading the figures: on two cores, service + broker + this process need about 2-3 ms of
CPU a page (printed), so ~800 pages/s is near what the machine does at all; "offered" is
the rate the producer achieved, and a last quarter much slower than the first means the
service fell behind. Batches are whatever a fetch returns (at most --batch-size records,
the service's default 500 unless given): at a fixed rate they are small, and each is a
transaction; a larger --batch-size changes nothing until batches reach it.

    python bench/exactly_once.py                # 3 rounds, 1 partition (6-9 min)
    python bench/exactly_once.py --rounds 1 --seconds 10 --backlog 2000    # ~2 min
    python bench/exactly_once.py --partitions 3 --batch-size 100 --backlog 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's package, even where another is installed

from benchlib import header, table  # noqa: E402  (bench/ is sys.path[0])
from kafkabench import (  # noqa: E402
    Broker,
    CpuClock,
    Result,
    Service,
    Topics,
    Watcher,
    counters,
    input_sources,
    med,
    offer,
    pct,
    produce_all,
    quarter,
    spread,
    workdir,
)
from throughput import create_topics, delete_topics  # noqa: E402

from stream_dedup.cli.sample import build  # noqa: E402

MODES = {"at-least-once": (), "exactly-once": ("--exactly-once",)}
SHORT = {"at-least-once": "alo", "exactly-once": "eo"}


# --- pages ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Content:
    url: str
    rest: bytes  # the page message after its url: `"html": "..."}`


def contents(n: int) -> list[Content]:
    """`n` pages of sample crawls (seeds 1, 2, ...), each URL once."""
    out: list[Content] = []
    seen: set[str] = set()
    seed = 1
    while len(out) < n:
        for p in build(seed=seed):
            if p.url not in seen:  # a seed's stub pages may share a tag's URL
                seen.add(p.url)
                out.append(Content(p.url, json.dumps({"html": p.html}).encode()[1:]))
        seed += 1
    return out[:n]


def message(c: Content, tag: str) -> tuple[bytes, bytes]:
    """(key, value) of the page under this phase's URL."""
    url = c.url.replace("http://", f"http://{tag}.", 1)
    return url.encode(), b'{"url": ' + json.dumps(url).encode() + b", " + c.rest


# --- one phase: one service in one mode -------------------------------------------------------


@dataclass
class Context:
    broker: Broker
    args: argparse.Namespace
    content: list[Content]
    logs: Path
    run_id: str


async def phase(ctx: Context, mode: str, rnd: int, test: str) -> Result:
    args = ctx.args
    tag = f"r{rnd}-{SHORT[mode]}-{test}-{ctx.run_id}"
    t = Topics.of(tag)
    bootstrap = ctx.broker.bootstrap
    await create_topics(bootstrap, {t.input: {}}, partitions=args.partitions)
    await create_topics(bootstrap, {t.decisions: {}, t.kept: {}, t.dead: {}})
    watcher = Watcher(bootstrap, t.decisions)
    await watcher.start()
    flags = [*MODES[mode], "--workers", str(args.workers)]
    if args.batch_size is not None:
        flags += ["--batch-size", str(args.batch_size)]
    svc: Service | None = None
    try:
        if test == "backlog":
            pages = [message(c, tag) for c in ctx.content[:args.backlog]]
            await produce_all(bootstrap, t.input, pages)
            svc = Service(bootstrap, t, flags, ctx.logs / f"{tag}.log")
            result = await drain(ctx, svc, watcher, t, mode, len(pages))
        else:
            svc = Service(bootstrap, t, flags, ctx.logs / f"{tag}.log")
            result = await paced(ctx, svc, watcher, t, mode, tag, float(test))
    finally:
        if svc is not None:
            code = svc.stop()
        await watcher.stop()
        try:
            await delete_topics(bootstrap, t.all(mode == "exactly-once"))
        except Exception as exc:  # a topic left behind must not hide the figures
            print(f"(could not delete the topics of {tag}: {exc})", file=sys.stderr)
    assert svc is not None
    result.exit_code = code
    result.duplicates = watcher.records - len(watcher.first)
    result.mix = watcher.mix
    text = svc.text()
    result.starts_over = text.count("starting over from the last commit")
    result.notes = svc.notes()
    return result


async def drain(ctx: Context, svc: Service, watcher: Watcher, t: Topics, mode: str,
                n: int) -> Result:
    """The backlog: from the first assignment to the last decision visible."""
    assigned = await svc.assigned()
    clock = CpuClock(svc, ctx.broker)  # imports and connecting are not counted
    sources = await input_sources(ctx.broker.bootstrap, t.input)
    assert len(sources) == n, (len(sources), n)
    await watcher.until(sources, svc)
    received = sorted(when for when, _ in watcher.first.values())
    first, last = received[0], received[-1]
    first_count = sum(1 for when in received if when == first)
    return Result(mode, "backlog", n, last - assigned, first_s=first - assigned,
                  steady=(n - first_count) / (last - first) if last > first else math.nan,
                  counts=counters(svc.metrics()), cpu=clock.stop())


async def paced(ctx: Context, svc: Service, watcher: Watcher, t: Topics, mode: str,
                tag: str, rate: float) -> Result:
    """A fixed rate into a running, warmed-up service; the latency of every page."""
    args = ctx.args
    bootstrap = ctx.broker.bootstrap
    await svc.assigned()
    warm = [message(c, tag) for c in ctx.content[:args.warm_pages]]
    timed = [message(c, tag) for c in ctx.content[args.warm_pages:args.warm_pages
                                                   + round(rate * args.seconds)]]
    await produce_all(bootstrap, t.input, warm)
    await watcher.until(await input_sources(bootstrap, t.input), svc)
    m0, clock = svc.metrics(), CpuClock(svc, ctx.broker)
    created, started, took = await offer(bootstrap, t.input, timed, rate)
    await watcher.until(set(created), svc)
    window = max(watcher.first[s][0] for s in created) - started
    usage, c0, c1 = clock.stop(), counters(m0), counters(svc.metrics())
    # in the order sent (the dict's), so that a queue that grows shows in the last pages
    sent = [watcher.first[s][1] - ms for s, ms in created.items()]
    visible = [watcher.first[s][0] * 1000 - ms for s, ms in created.items()]
    return Result(mode, f"{rate:g}", len(timed), window, offered=len(timed) / took,
                  sent_ms=sent, visible_ms=visible,
                  counts={k: c1[k] - c0[k] for k in c1}, cpu=usage)


# --- figures ----------------------------------------------------------------------------------

ALO, EO = MODES


def cpu_cells(rs: list[Result]) -> list[str]:
    """CPU s/1000 pages of the service, the broker and this process; host %, others' %."""
    def each(part: str) -> list[float]:
        return [1000 * getattr(r.cpu, part) / r.pages for r in rs if r.cpu]
    return [spread(each("service"), "{:.2f}"), spread(each("broker"), "{:.2f}"),
            spread(each("own"), "{:.2f}"), spread([r.cpu.host for r in rs if r.cpu]),
            spread([r.cpu.others for r in rs if r.cpu])]


CPU_HEADERS = ["service CPU s/1000 pages", "broker CPU s/1000", "bench CPU s/1000",
               "host CPU %", "others' CPU %"]


def ratio_line(label: str, eo: list[float], alo: list[float], target: str,
               ok: Callable[[float], bool]) -> tuple[str, str]:
    """exactly-once / at-least-once: of the medians, and the rounds' own (paired) ratios."""
    ratio = med(eo) / med(alo)
    rounds = [e / a for e, a in zip(eo, alo, strict=True)]
    verdict = "yes" if ok(ratio) else "**no**"
    return (f"{label}: exactly-once / at-least-once **{ratio:.2f}x** (rounds' ratios: median "
            f"{med(rounds):.2f}, {min(rounds):.2f}-{max(rounds):.2f}); target {target}: "
            f"{verdict}", f"{label} {ratio:.2f}x ({target}: {verdict})")


def report(results: list[Result], args: argparse.Namespace) -> None:
    def of(mode: str, test: str) -> list[Result]:
        return [r for r in results if r.mode == mode and r.test == test]

    summary: list[str] = []
    n = f"median (min-max) of {args.rounds} round(s)"
    if args.backlog:
        rows = []
        for mode in MODES:
            rs = of(mode, "backlog")
            rows.append([mode, spread([r.first_s for r in rs], "{:.2f}"),
                         spread([r.rate for r in rs]), spread([r.steady for r in rs]),
                         spread([r.counts["batches"] for r in rs]),
                         spread([r.pages / r.counts["batches"] for r in rs if r.counts["batches"]]),
                         *cpu_cells(rs), sum(r.starts_over for r in rs),
                         sum(r.duplicates for r in rs)])
        print(f"### Throughput: a backlog of {args.backlog} pages, {args.partitions} input "
              f"partition(s); {n}\n")
        print(table(["mode", "1st decision after s", "pages/s from assignment",
                     "pages/s from 1st decision", "batches", "pages/batch", *CPU_HEADERS,
                     "starts over", "duplicates"], rows))
        print()
        for label, attr in (("throughput", "rate"), ("throughput from 1st decision",
                                                     "steady")):
            line, short = ratio_line(label, [getattr(r, attr) for r in of(EO, "backlog")],
                                     [getattr(r, attr) for r in of(ALO, "backlog")],
                                     ">= 0.8x", lambda x: x >= 0.8)
            print(line)
            summary.append(short)
        print()
    for rate in args.rate_list:
        test = f"{rate:g}"
        print(f"### Latency at {test} pages/s offered for {args.seconds:g} s "
              f"({of(ALO, test)[0].pages} pages a run), {args.partitions} input partition(s); "
              f"ms, {n}\n")
        rows = []
        for mode in MODES:
            rs = of(mode, test)
            rows.append([mode, *(spread([pct(getattr(r, name), q) for r in rs])
                                 for name in ("sent_ms", "visible_ms") for q in (50, 90, 99)),
                         spread([max(r.visible_ms) for r in rs]),
                         spread([quarter(r.visible_ms, 0) for r in rs]),
                         spread([quarter(r.visible_ms, 3) for r in rs])])
        print(table(["mode", "sent p50", "sent p90", "sent p99", "visible p50", "visible p90",
                     "visible p99", "visible max", "visible p50, 1st quarter",
                     "visible p50, last quarter"], rows))
        print()
        rows = []
        for mode in MODES:
            rs = of(mode, test)
            rows.append([mode, spread([r.offered for r in rs]),
                         spread([r.counts["batches"] / r.seconds for r in rs], "{:.1f}"),
                         spread([r.pages / r.counts["batches"] for r in rs if r.counts["batches"]],
                                "{:.1f}"),
                         spread([1000 * r.counts["commit_s"] / r.counts["commits"]
                                 for r in rs if r.counts["commits"]], "{:.1f}"),
                         f"{sum(r.counts['committed'] for r in rs):.0f} / "
                         f"{sum(r.counts['aborted'] for r in rs):.0f}",
                         *cpu_cells(rs), sum(r.starts_over for r in rs),
                         sum(r.duplicates for r in rs)])
        print(table(["mode", "offered/s", "batches/s", "pages/batch", "commit ms/batch",
                     "transactions committed / aborted", *CPU_HEADERS, "starts over",
                     "duplicates"], rows))
        print()
        for name, label in (("sent_ms", "sent"), ("visible_ms", "visible")):
            line, short = ratio_line(f"{test}/s p99 {label}",
                                     [pct(getattr(r, name), 99) for r in of(EO, test)],
                                     [pct(getattr(r, name), 99) for r in of(ALO, test)],
                                     "<= 2x", lambda x: x <= 2)
            print(line)
            summary.append(short)
        print()
    print("summary: " + "; ".join(summary))
    print("\n(batches: one offset commit each at-least-once, one transaction each "
          "exactly-once. commit ms/batch: stream_dedup_kafka_commit_seconds, the offset "
          "commit at-least-once, the whole transaction exactly-once: begin, sends, acks, "
          "offsets, commit. sent: decision CreateTime - page CreateTime; visible: received by "
          "a read_committed reader - page CreateTime. others' CPU: host CPU minus the "
          "service's, the broker's and this process's: the rest of the machine. duplicates: "
          "decisions visible beyond one a page.)")
    mixes = {m: sum((r.mix for r in results if r.mode == m), Counter()) for m in MODES}
    print(f"\ndecision mix, all phases: {dict(mixes[ALO].most_common())}"
          + ("" if mixes[ALO] == mixes[EO] else
             f"\n  exactly-once DIFFERS: {dict(mixes[EO].most_common())}"))
    exits = Counter((r.mode, r.exit_code) for r in results)
    print("exit codes after SIGTERM: " + ", ".join(f"{m} {c}: {k}" for (m, c), k in
                                                     sorted(exits.items(), key=str)))
    print("\nWARNING/ERROR lines in the service logs (numbers as N, names as <...>), by mode:")
    for mode in MODES:
        notes = Counter(note for r in results if r.mode == mode for note in r.notes)
        runs = sum(1 for r in results if r.mode == mode)
        print(f"- {mode}: {sum(notes.values())} in {runs} runs")
        for note, count in notes.most_common():
            print(f"    {count:4d} x {note}")


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds; each runs every test in both modes (default 3)")
    ap.add_argument("--backlog", type=int, default=5000, metavar="N",
                    help="pages of the throughput test; 0: no throughput test (default 5000)")
    ap.add_argument("--rates", default="300,800", metavar="LIST",
                    help="offered pages/s of the latency tests, comma-separated; '' for none "
                    "(default 300,800)")
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="seconds each rate is offered (default 20)")
    ap.add_argument("--warm-pages", type=int, default=60, metavar="N",
                    help="pages decided before a rate's timed window (default 60)")
    ap.add_argument("--warm-up-seconds", type=float, default=15.0, metavar="S",
                    help="first, both modes at the highest rate for S seconds, not counted: "
                    "a fresh broker's JVM spends ~3x the CPU a page until its code is "
                    "compiled; 0: none (default 15)")
    ap.add_argument("--partitions", type=int, default=1,
                    help="partitions of the input topic (default 1)")
    ap.add_argument("--batch-size", type=int, metavar="N",
                    help="serve --batch-size, both modes (default: the service's, 500)")
    ap.add_argument("--workers", type=int, default=1, help="serve --workers (default 1)")
    ap.add_argument("--bootstrap", metavar="HOST:PORT",
                    help="use this running broker instead of starting one (no broker CPU "
                    "figures then)")
    ap.add_argument("--logs", type=Path, metavar="DIR",
                    help="keep the service logs here (default: a new temporary directory, "
                    "kept and printed)")
    args = ap.parse_args(argv)
    args.rate_list = [float(r) for r in args.rates.split(",") if r.strip()]
    if args.rounds < 1 or args.backlog < 0 or args.seconds <= 0 or args.partitions < 1:
        ap.error("--rounds, --seconds and --partitions must be positive, --backlog >= 0")
    if not args.backlog and not args.rate_list:
        ap.error("nothing to measure: --backlog 0 and no --rates")
    return args


def run_phase(ctx: Context, mode: str, rnd: int, test: str) -> Result:
    """One phase, and a line about it on stderr (round 0: the warm-up, not counted)."""
    r = asyncio.run(phase(ctx, mode, rnd, test))
    assert r.cpu is not None
    detail = (f"{r.rate:.0f} pages/s" if test == "backlog" else
              f"offered {r.offered:.0f}/s, p99 sent {pct(r.sent_ms, 99):.0f} ms, visible "
              f"{pct(r.visible_ms, 99):.0f} ms")
    print(f"[{f'round {rnd}' if rnd else 'warm-up'}] {test:>7} {mode:<13}: {detail}, "
          f"{r.counts['batches']:.0f} batches; CPU s/1000 pages: service "
          f"{1000 * r.cpu.service / r.pages:.2f}, broker {1000 * r.cpu.broker / r.pages:.2f}; "
          f"others {r.cpu.others:.0f} %"
          + (f", {r.starts_over} start(s) over" if r.starts_over else ""),
          file=sys.stderr, flush=True)
    return r


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work, logs = workdir("stream-dedup-eobench-", args.logs)
    print(header("## exactly-once against at-least-once (bench/exactly_once.py)"))
    need = max(args.backlog, args.warm_pages + round(max(args.rate_list, default=0) * args.seconds))
    started = time.perf_counter()
    content = contents(need)
    print(f"pages: {len(content)} distinct sample pages (stream_dedup.cli.sample.build, seeds "
          f"1...; mean message {statistics.mean(len(c.rest) for c in content) / 1e3:.1f} kB), "
          f"the same content in every phase under URLs of its own; built in "
          f"{time.perf_counter() - started:.1f} s")
    broker = Broker(None, args.bootstrap) if args.bootstrap else Broker.start(work / "kafka")
    print(f"broker: {broker.bootstrap} ({'given' if args.bootstrap else 'started by this run'})"
          f"; serve --workers {args.workers}"
          + (f" --batch-size {args.batch_size}" if args.batch_size else "")
          + f"; service logs in {logs}\n", flush=True)
    ctx = Context(broker, args, content, logs, uuid.uuid4().hex[:6])
    tests = (["backlog"] if args.backlog else []) + [f"{r:g}" for r in args.rate_list]
    results: list[Result] = []
    try:
        if args.warm_up_seconds:
            warm = Context(broker, argparse.Namespace(**{**vars(args), "seconds":
                                                         args.warm_up_seconds}),
                           content, logs, ctx.run_id)
            for mode in MODES:
                run_phase(warm, mode, 0, f"{max(args.rate_list):g}" if args.rate_list
                          else "backlog")
        for rnd in range(1, args.rounds + 1):
            order = list(MODES) if rnd % 2 else list(MODES)[::-1]
            for test in tests:
                for mode in order:
                    results.append(run_phase(ctx, mode, rnd, test))
    finally:
        broker.stop()
    report(results, args)
    print(f"\nrun took {(time.perf_counter() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
