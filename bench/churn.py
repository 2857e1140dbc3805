#!/usr/bin/env python3
"""Churn campaign (issue 43): `serve` instances on one Redis index while members are
SIGKILLed, SIGTERMed and added at random, against the same group left still.

A script that prints figures and the invariants it checked; exit status 1 if any invariant
failed in any run. Per round (seed = --seed + round - 1) and mode, two runs on the same
pages with the same instances (the order alternates between rounds), each on fresh topics
and a flushed Redis:
- still: --instances `stream-dedup serve --index redis` in one consumer group, started and
  assigned, then the pages produced over --produce-s seconds, nothing else;
- churn: the same, and from the first page on, every 2-5 s (seeded), a member is SIGKILLed
  or SIGTERMed (the signal to its process group: each serve runs in a session of its own,
  as a container's processes) or a member is added, for --churn-s seconds, at least one
  member always left alive and at most --max-members running; then the churn stops and the
  members left must finish.
The pages (tests/churnkit.py `crawl`): 60 % in groups of 4 mutual near-duplicates
(tests/racekit.py group_pages: near, exact and canonical copies), a group's members on 4
different partitions, the rest unique pages; in a seeded order, produced partition by
partition by one producer in ~1 s slices.

Printed per run: the events (time, kill/term/join/died, member), each SIGTERM's exit code
and seconds to exit (the bound: 40 s; a member past it gets SIGUSR1, which writes its
threads' stacks to its log, then SIGKILL; * marks the SIGTERMs sent to the members left at
the end), the time from the churn's end (still: from the last page produced) to the last
decision visible (target 30 s; the wait stops at --finish-limit), pages/s from the first
page produced to the last decision (both runs, side by side, and churn / still), and the
invariants: decisions missing, repeated (exactly-once: must be 0; at-least-once: counted),
a record decided differently twice, the kept topic against the keep decisions, drops
against a page not kept, double keeps of a near-duplicate pair by the filter rule
(racekit.duplicates), "Future exception was never retrieved" and tracebacks in the logs.
Every log is kept (--logs, or a temporary directory, printed), with the WARNING/ERROR lines
counted per mode at the end. Topics are deleted after each run (--keep-topics: not).

A failing round is rerun with `--seed <its seed> --rounds 1 --mode <its mode>`.

    python bench/churn.py --bootstrap 127.0.0.1:9092 --redis-url redis://127.0.0.1:7000
    python bench/churn.py --bootstrap B --redis-url R --mode exactly-once --rounds 2 --seed 7
    python bench/churn.py --bootstrap B --redis-url R --pages 600 --churn-s 20   # ~2 min
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import benchlib
from benchlib import header, table

sys.path.insert(0, str(benchlib.REPO / "tests"))
from churncheck import Result, problems  # noqa: E402
from churnkit import MODES, Config, campaign, crawl  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True, metavar="HOST:PORT",
                    help="a running Kafka broker (topics get unique names)")
    ap.add_argument("--redis-url", required=True, metavar="URL",
                    help="a Redis (Cluster) this benchmark may FLUSH before every run")
    ap.add_argument("--instances", type=int, default=3,
                    help="members at the start, both runs (default 3)")
    ap.add_argument("--max-members", type=int, metavar="N",
                    help="no join while N members run (default: --instances + 2)")
    ap.add_argument("--partitions", type=int, default=6,
                    help="partitions of the input topic (default 6)")
    ap.add_argument("--pages", type=int, default=1500, help="pages a run (default 1500)")
    ap.add_argument("--churn-s", type=float, default=45.0, metavar="S",
                    help="seconds of churn from the first page produced (default 45)")
    ap.add_argument("--produce-s", type=float, metavar="S",
                    help="seconds over which the pages are produced (default: 2/3 of "
                    "--churn-s; 0: all at once)")
    ap.add_argument("--mode", choices=[*MODES, "both"], default="both",
                    help="delivery mode of the services (default both)")
    ap.add_argument("--seed", type=int, metavar="N",
                    help="seed of the first round (pages, their order, the churn's events); "
                    "round r uses N + r - 1 (default: from the clock, printed)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds (default 1)")
    ap.add_argument("--batch-size", type=int, default=50,
                    help="serve --batch-size (default 50: many batches in flight)")
    ap.add_argument("--finish-limit", type=float, default=120.0, metavar="S",
                    help="the longest wait for the last decision after the churn (default "
                    "120); the target is 30")
    ap.add_argument("--logs", type=Path, metavar="DIR",
                    help="keep the instances' logs here (default: a new temporary directory)")
    ap.add_argument("--keep-topics", action="store_true", help="do not delete the topics")
    ap.add_argument("--code", type=Path, default=benchlib.REPO, metavar="DIR",
                    help="a checkout (or a copy of its stream_dedup/ with the built kernels) "
                    "whose code the instances run: PYTHONPATH=DIR, from DIR (default: this "
                    "checkout; a snapshot keeps others' edits in progress out of a run)")
    args = ap.parse_args(argv)
    if args.instances < 1 or args.pages < 8 or args.rounds < 1 or args.partitions < 4:
        ap.error("--instances and --rounds must be >= 1, --pages >= 8, --partitions >= 4")
    args.max_members = args.max_members or args.instances + 2
    args.produce_s = args.churn_s * 2 / 3 if args.produce_s is None else args.produce_s
    args.seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    return args


def summary(r: Result) -> str:
    """One paragraph of what a campaign saw."""
    c = r.counts()
    terms = ", ".join(f"{t.name}{'*' if t.final else ''} rc {t.rc} in "
                      + ("HUNG" if t.seconds is None else f"{t.seconds:.1f} s") for t in r.terms)
    fin = "NOT FINISHED" if r.finish_s is None else f"{r.finish_s:.1f} s"
    rate = "-" if r.rate is None else f"{r.rate:.1f}"
    lat = ["-" if x is None else f"{x:.1f}" for x in (r.latency(q) for q in (50, 99, 100))]
    return (f"{r.mode} {'churn' if r.churn else 'still'} seed {r.seed}: {r.pages} pages, "
            f"{c['kills']} kills, {c['terms']} terms, {c['joins']} joins"
            + (f", died {r.died}" if r.died else "") + f"; produced in {r.produced_s:.1f} s; "
            f"done {fin} after {'the churn' if r.churn else 'the last page'} "
            f"({rate} pages/s from the first page; page to decision p50 {lat[0]} p99 "
            f"{lat[1]} max {lat[2]} s); decided {r.decided}, missing {r.missing}, "
            f"repeated {r.repeated}, changed {r.changed}, keeps {r.keeps}, kept missing "
            f"{r.kept_missing} extra {r.kept_extra} repeats {r.kept_repeats}, dangling drops "
            f"{r.dangling}, double keeps {r.double_keeps}; "
            f"logs: {dict(r.bad_lines) or 'clean'}; SIGTERMs (* final): {terms or 'none'}")


def terms(r: Result) -> str:
    return ", ".join(f"{t.name}{'*' if t.final else ''}: rc {t.rc} "
                     + ("HUNG" if t.seconds is None else f"{t.seconds:.1f}s") for t in r.terms)


def fmt(x: float | None, spec: str = "{:.1f}") -> str:
    return "–" if x is None else spec.format(x)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the running campaign kills its members


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ours, so that asyncio.run leaves SIGINT alone and SIGTERM stops the run the same way.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="stream-dedup-churn-"))
    logs.mkdir(parents=True, exist_ok=True)
    modes = list(MODES) if args.mode == "both" else [args.mode]
    print(header("## churn: serve instances on one Redis index, killed, stopped and added "
                 "(bench/churn.py)"))
    print(f"seed {args.seed} (rounds use {args.seed}..{args.seed + args.rounds - 1}); "
          f"{args.instances} instances (at most {args.max_members}), {args.partitions} "
          f"partitions, {args.pages} pages produced over {args.produce_s:g} s, churn "
          f"{args.churn_s:g} s, --batch-size {args.batch_size}; instances run {args.code}; "
          f"logs in {logs}\n", flush=True)
    rows, failed = [], []
    notes: dict[str, Counter[str]] = {m: Counter() for m in modes}
    started = time.monotonic()
    for rnd in range(1, args.rounds + 1):
        seed = args.seed + rnd - 1
        items = crawl(args.pages, args.partitions, seed)
        for mode in modes:
            cfg = Config(args.bootstrap, args.redis_url, mode, items, args.partitions, logs,
                         seed, instances=args.instances, max_members=args.max_members,
                         churn_s=args.churn_s, produce_s=args.produce_s,
                         batch_size=args.batch_size, finish_limit_s=args.finish_limit,
                         code=args.code.resolve())
            runs: dict[bool, Result] = {}
            for churn in ([False, True] if rnd % 2 else [True, False]):
                r = runs[churn] = campaign(cfg, churn=churn, delete=not args.keep_topics)
                notes[mode] += r.notes
                found = problems(r)
                print(f"[round {rnd}] {summary(r)}", flush=True)
                if churn:
                    print("  events: " + ", ".join(f"{at:.1f}s {kind} {name}"
                                                   for at, kind, name in r.events))
                if found:
                    failed.append((rnd, seed, mode, churn, found))
                    print("  PROBLEMS:\n    " + "\n    ".join(found) + "\n" + "\n".join(
                        "    | " + line for line in r.evidence.splitlines()[-80:]),
                        flush=True)
            c, s = runs[True], runs[False]
            counts = c.counts()
            rows.append([rnd, seed, mode, f"{counts['kills']}/{counts['terms']}/"
                         f"{counts['joins']}", terms(c) or "–", fmt(c.finish_s),
                         fmt(s.finish_s), fmt(c.rate), fmt(s.rate),
                         fmt(c.rate / s.rate if c.rate and s.rate else None, "{:.2f}"),
                         f"{fmt(c.latency(99))}/{fmt(s.latency(99))}",
                         f"{fmt(c.latency(100))}/{fmt(s.latency(100))}",
                         f"{c.missing}/{s.missing}", f"{c.repeated}/{s.repeated}",
                         f"{c.kept_missing + c.kept_extra}/{s.kept_missing + s.kept_extra}",
                         f"{c.dangling}/{s.dangling}", f"{c.double_keeps}/{s.double_keeps}",
                         f"{sum(c.bad_lines.values())}/{sum(s.bad_lines.values())}",
                         f"{len(problems(c))}/{len(problems(s))}"])
    print("\n### Churn against still (cells churn/still where two)\n")
    print(table(["round", "seed", "mode", "kills/terms/joins", "SIGTERM: rc, s to exit (* at "
                 "the end)", "done s after churn", "still: s after last page",
                 "pages/s churn", "pages/s still", "churn/still", "p99 page to decision s",
                 "max page to decision s", "missing", "repeated",
                 "kept topic wrong", "dangling drops", "double keeps", "bad log lines",
                 "problems"], rows, right=False))
    print("\n(done s after churn: from the churn's end to the last decision visible to a "
          "read_committed reader (its CreateTime), '–': not within --finish-limit, 0: before "
          "the churn ended; pages/s: pages / seconds from the first page produced to the last "
          "decision; page to decision: a page's CreateTime to its first visible decision's; "
          "production paced over "
          f"{args.produce_s:g} s in both runs)")
    print("\nWARNING/ERROR lines of the instances' logs (numbers as N), by mode:")
    for mode in modes:
        print(f"- {mode}: {sum(notes[mode].values())}")
        for note, n in notes[mode].most_common(25):
            print(f"    {n:5d} x {note}")
    print(f"\n{len(failed)} run(s) with problems" + "".join(
        f"\n- round {rnd} seed {seed} {mode} {'churn' if churn else 'still'}: "
        + "; ".join(found)[:600] for rnd, seed, mode, churn, found in failed))
    print(f"\nrun took {(time.monotonic() - started) / 60:.1f} min; logs in {logs}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
