#!/usr/bin/env python3
"""Page-to-decision latency through Kafka at fixed offered rates: `serve` of this checkout,
and of an older one (--before) in the same rounds, on the same broker.

A script that prints figures, not a test. What a crawl engineer sizing a cluster asks: at R
pages/s into one partition, how long from the page's CreateTime to its decision's
CreateTime (p50/p90/p99), for new pages and for a stream with near-duplicates in it?

Pages: the HTML responses of ../shared/corpora/warc (distinct bodies of 1-64 kB whose text
is mostly ASCII letters, read in place; the corpora hold no Javadoc pages). Every page
offered is new to the index and has a URL of its own (held out): page i is corpus body
i mod N with the letters of its text (between tags) put through a letter permutation of
its own (seeded by i), so its shingles are new and its markup, sizes and tokens a page
are the corpus's. Kinds:
- distinct: every page new;
- near: from the --near-lag-th page on, every other page is a near-duplicate of the new
  page offered --near-lag pages before it (the same text with one word inserted in its longest
  run of text, under another URL), so half the pages go through candidates and
  verification.

In one run it starts a broker of its own (kafkabench.py's Broker: deploy/kafka-local
in a temporary directory on free ports; --bootstrap uses a running one), warms it up (each
code once at the highest rate, not counted), then per round, per kind and rate, runs each
code as a fresh `python -P -m stream_dedup serve` (PYTHONPATH = its checkout) on fresh
topics, the order of the codes turned around every other round. A phase: service started
and assigned, --warm-pages decided, then a producer offers R pages/s for --seconds.
Latency: "sent" = decision CreateTime - page CreateTime (the issue's measure); "visible" =
when a read_committed reader, polling all along, received the decision. The p50 of the
last quarter of the pages against the first tells whether the service fell behind. CPU
of the service and of the rest of the machine (others') is printed per phase: the machine
is shared.

--before REV: a directory (an older checkout whose extension is built) or a git revision
(checked out with `git worktree add` in a temporary directory and built there with
`python3 setup.py build_ext --inplace`; removed at the end).

    python bench/latency.py --before b490658            # 3 rounds, 300 and 800/s (~13 min)
    python bench/latency.py --rounds 1 --seconds 8 --kinds distinct --rates 800
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import math
import random
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchlib import REPO, header, load_warc_pages, table
from bigwarc import lettered
from kafkabench import (
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
from throughput import create_topics, delete_topics

KINDS = ("distinct", "near")
STEPS = ("decide", "deliver", "index-commit", "source-commit")  # stream_dedup/runner/loop.py
STAGES = ("canonicalize", "sketch", "index", "verify")  # stream_dedup/metrics.py
_RUN = re.compile(rb">([^<]{40,})<")
_TEXT = re.compile(rb">([^<]+)<")
_LETTER = re.compile(rb"[A-Za-z]")
_PRINTING = re.compile(rb"[^\x00-\x20]")


# --- pages ----------------------------------------------------------------------------------


def corpus_bodies(max_bytes: int = 65536) -> list[tuple[bytes, str]]:
    """(body, content type) of the corpus's distinct HTML responses of 1 kB-max_bytes whose text
    is mostly ASCII letters (at least 1,000 of them: permuting them makes a new page), in
    order."""
    seen: set[bytes] = set()
    out = []
    pages, _ = load_warc_pages()
    for p in pages:
        digest = hashlib.sha1(p.body).digest()
        text = b"".join(m[1] for m in _TEXT.finditer(p.body))
        letters = len(_LETTER.findall(text))
        if (1000 <= len(p.body) <= max_bytes and digest not in seen and letters >= 1000
                and letters >= 0.6 * len(_PRINTING.findall(text))):
            seen.add(digest)
            ctype = next((v for k, v in p.headers if k.lower() == "content-type"), "text/html")
            out.append((p.body, ctype))
    return out


def new_page(bodies: list[tuple[bytes, str]], i: int) -> tuple[bytes, str]:
    """Page i: corpus body i mod N, its text's letters permuted (seed i): new shingles."""
    body, ctype = bodies[i % len(bodies)]
    letters = bytearray(b"abcdefghijklmnopqrstuvwxyz")
    random.Random(i).shuffle(letters)
    return lettered(body, bytes(letters)), ctype


def near_copy(body: bytes) -> bytes:
    """The same page with one word inserted in the middle of its longest run of text."""
    runs = list(_RUN.finditer(body))
    if not runs:
        return body + b"<p>x</p>"
    m = max(runs, key=lambda r: r.end() - r.start())
    cut = body.find(b" ", (m.start(1) + m.end(1)) // 2, m.end(1))
    cut = cut if cut >= 0 else m.end(1)
    return body[:cut] + b" revised" + body[cut:]


def message(tag: str, i: int, body: bytes, ctype: str) -> tuple[bytes, bytes]:
    url = f"http://{tag}.example.test/page/{i}"
    value = {"url": url, "body_b64": base64.b64encode(body).decode(),
             "headers": [["Content-Type", ctype]]}
    return url.encode(), json.dumps(value).encode()


def stream(bodies: list[tuple[bytes, str]], kind: str, tag: str, first: int, n: int,
           lag: int) -> tuple[list[tuple[bytes, bytes]], list[bool]]:
    """n messages from page number `first` on, and which of them are near-duplicates."""
    out: list[tuple[bytes, bytes]] = []
    near: list[bool] = []
    made: list[bytes] = []  # the new pages' bodies, in the order sent
    fresh, lag = first, lag | 1  # odd: a near-duplicate's page is at an even place, new
    for j in range(n):
        if kind == "near" and j >= lag and j % 2 == 1:
            body, ctype = near_copy(made[j - lag]), "text/html"
            near.append(True)
        else:
            body, ctype = new_page(bodies, fresh)
            fresh += 1
            near.append(False)
        made.append(body)
        out.append(message(tag, first + j, body, ctype))
    return out, near


# --- the checkouts --------------------------------------------------------------------------


def checkout(rev: str, work: Path) -> tuple[Path, bool]:
    """(directory, made here) of --before: a directory as given, or a worktree of REV built
    in `work`."""
    given = Path(rev)
    if given.is_dir():
        return given.resolve(), False
    where = work / f"before-{rev[:12]}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(where), rev],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=where,
                   check=True, capture_output=True)
    return where, True


@dataclass
class Context:
    broker: Broker
    args: argparse.Namespace
    bodies: list[tuple[bytes, str]]
    codes: dict[str, Path]
    logs: Path
    run_id: str


async def phase(ctx: Context, code: str, rnd: int, kind: str, rate: float,
                seconds: float) -> tuple[Result, list[bool]]:
    args = ctx.args
    tag = f"r{rnd}-{code}-{kind}-{rate:g}-{ctx.run_id}"
    t = Topics.of(tag)
    bootstrap = ctx.broker.bootstrap
    await create_topics(bootstrap, {t.input: {}}, partitions=1)
    await create_topics(bootstrap, {t.decisions: {}, t.kept: {}, t.dead: {}})
    watcher = Watcher(bootstrap, t.decisions)
    await watcher.start()
    flags = ["--workers", str(args.workers), *(["--exactly-once"] if args.exactly_once else [])]
    if args.batch_size:
        flags += ["--batch-size", str(args.batch_size)]
    svc = Service(bootstrap, t, flags, ctx.logs / f"{tag}.log", code=ctx.codes[code])
    try:
        await svc.assigned()
        n = round(rate * seconds)
        warm, _ = stream(ctx.bodies, "distinct", tag, 0, args.warm_pages, args.near_lag)
        timed, near = stream(ctx.bodies, kind, tag, args.warm_pages, n, args.near_lag)
        await produce_all(bootstrap, t.input, warm)
        await watcher.until(await input_sources(bootstrap, t.input), svc)
        m0, clock = svc.metrics(), CpuClock(svc, ctx.broker)
        created, started, took = await offer(bootstrap, t.input, timed, rate)
        await watcher.until(set(created), svc)
        window = max(watcher.first[s][0] for s in created) - started
        m1 = svc.metrics()
        usage, c0, c1 = clock.stop(), counters(m0), counters(m1)
        c1.update(step_means(m0, m1))
    finally:
        code_rc = svc.stop()
        await watcher.stop()
        try:
            await delete_topics(bootstrap, t.all(args.exactly_once))
        except Exception as exc:  # a topic left behind must not hide the figures
            print(f"(could not delete the topics of {tag}: {exc})", file=sys.stderr)
    sent = [watcher.first[s][1] - ms for s, ms in created.items()]
    visible = [watcher.first[s][0] * 1000 - ms for s, ms in created.items()]
    r = Result(code, f"{kind} {rate:g}", n, window, offered=n / took, sent_ms=sent,
               visible_ms=visible, counts={k: c1[k] - c0.get(k, 0.0) for k in c1}, cpu=usage,
               duplicates=watcher.records - len(watcher.first), exit_code=code_rc,
               mix=watcher.mix, notes=svc.notes())
    return r, near


def step_means(m0: dict[str, float], m1: dict[str, float]) -> dict[str, float]:
    """Over the window: ms a batch in each runner step (stream_dedup_batch_step_seconds;
    codes without it: none), and CPU ms a page in each stage of the pipeline (its sum over
    the pages decided; stream_dedup_stage_seconds)."""
    out = {}
    for step in STEPS:
        name = f'stream_dedup_batch_step_seconds_{{}}{{{{step="{step}"}}}}'
        count = m1.get(name.format("count"), 0.0) - m0.get(name.format("count"), 0.0)
        if count:
            total = m1[name.format("sum")] - m0.get(name.format("sum"), 0.0)
            out[f"ms {step}"] = 1000 * total / count
            fast = [k for k in m1 if k.startswith("stream_dedup_batch_step_seconds_bucket{")
                    and f'step="{step}"' in k and 'le="0.05"' in k]
            if fast:  # batches whose step took longer than 50 ms: the service's own stalls
                out[f"slow {step}"] = count - (m1[fast[0]] - m0.get(fast[0], 0.0))
    pages = sum(v for k, v in m1.items() if k.startswith("stream_dedup_pages_total")) - sum(
        v for k, v in m0.items() if k.startswith("stream_dedup_pages_total"))
    for stage in STAGES:
        name = f'stream_dedup_stage_seconds_sum{{stage="{stage}"}}'
        if pages and name in m1:
            out[f"stage {stage}"] = 1000 * (m1[name] - m0.get(name, 0.0)) / pages
    return out


def run_phase(ctx: Context, code: str, rnd: int, kind: str, rate: float,
              seconds: float) -> tuple[Result, list[bool]]:
    r, near = asyncio.run(phase(ctx, code, rnd, kind, rate, seconds))
    assert r.cpu is not None
    print(f"[{f'round {rnd}' if rnd else 'warm-up'}] {kind:>8} {r.test.split()[1]:>4}/s "
          f"{code:<7}: offered {r.offered:.0f}/s, sent p50/p90/p99 "
          f"{pct(r.sent_ms, 50):.0f}/{pct(r.sent_ms, 90):.0f}/{pct(r.sent_ms, 99):.0f} ms, "
          f"{r.pages / max(r.counts['batches'], 1):.1f} pages/batch; service "
          f"{1000 * r.cpu.service / r.pages:.2f} ms CPU/page; others' CPU "
          f"{r.cpu.others:.0f} %", file=sys.stderr, flush=True)
    return r, near


# --- figures --------------------------------------------------------------------------------


def report(results: list[tuple[Result, list[bool]]], args: argparse.Namespace,
           codes: list[str]) -> None:
    n = f"median (min-max) of {args.rounds} round(s)"
    summary = []
    for rate in args.rate_list:
        for kind in args.kind_list:
            test = f"{kind} {rate:g}"
            print(f"### {kind} pages at {rate:g} pages/s offered, {args.seconds:g} s; ms, {n}\n")
            rows = []
            for code in codes:
                rs = [(r, near) for r, near in results if r.mode == code and r.test == test]
                only = [[ms for ms, is_near in zip(r.sent_ms, near, strict=True) if is_near]
                        for r, near in rs]
                rows.append([code, spread([r.offered for r, _ in rs]),
                             *(spread([pct(r.sent_ms, q) for r, _ in rs]) for q in (50, 90, 99)),
                             spread([pct(x, 50) for x in only if x]) if kind == "near" else "–",
                             spread([pct(r.visible_ms, 50) for r, _ in rs]),
                             spread([pct(r.visible_ms, 99) for r, _ in rs]),
                             spread([quarter(r.sent_ms, 3) for r, _ in rs]),
                             spread([r.pages / max(r.counts["batches"], 1) for r, _ in rs],
                                    "{:.1f}"),
                             spread([1000 * r.cpu.service / r.pages for r, _ in rs if r.cpu],
                                    "{:.2f}"),
                             spread([r.cpu.others for r, _ in rs if r.cpu])])
            print(table(["code", "offered/s", "p50", "p90", "p99", "p50 of the near-dups",
                         "visible p50", "visible p99", "p50 last quarter", "pages/batch",
                         "service CPU ms/page", "others' CPU %"], rows))
            print()
            steps = []
            for code in codes:
                rs = [r for r, _ in results if r.mode == code and r.test == test]
                if any(f"ms {s}" in r.counts for r in rs for s in STEPS):
                    steps.append([code, *(spread([r.counts.get(f"ms {s}", math.nan)
                                                  for r in rs], "{:.1f}") for s in STEPS)])
            if steps:
                print("ms a batch in each step of the runner (stream_dedup_batch_step_seconds):"
                      "\n")
                print(table(["code", *STEPS], steps))
                print()
                slow = [[code, *(spread([r.counts.get(f"slow {s}", math.nan) for r, _ in results
                                         if r.mode == code and r.test == test], "{:.0f}")
                                 for s in STEPS)] for code in codes]
                print("batches whose step took over 50 ms (a stall in the service):\n")
                print(table(["code", *STEPS], slow))
                print()
            stages = [[code, *(spread([r.counts.get(f"stage {s}", math.nan) for r, _ in results
                                       if r.mode == code and r.test == test], "{:.3f}")
                               for s in STAGES)] for code in codes]
            print("ms a page in each stage of the pipeline (stream_dedup_stage_seconds, "
                  "summed over the pages decided):\n")
            print(table(["code", *STAGES], stages))
            print()
            if len(codes) == 2:
                for q in (50, 99):
                    a = [pct(r.sent_ms, q) for r, _ in results if r.mode == codes[0]
                         and r.test == test]
                    b = [pct(r.sent_ms, q) for r, _ in results if r.mode == codes[1]
                         and r.test == test]
                    ratios = [x / y for x, y in zip(a, b, strict=True)]
                    line = (f"{test}/s p{q}: {codes[0]} {med(a):.0f} ms, {codes[1]} "
                            f"{med(b):.0f} ms: {med(a) / med(b):.2f}x (rounds "
                            f"{min(ratios):.2f}-{max(ratios):.2f})")
                    summary.append(line)
    if summary:
        print("summary (sent = decision CreateTime - page CreateTime):")
        print("\n".join(f"- {line}" for line in summary))
    for code in codes:
        mix = sum((r.mix for r, _ in results if r.mode == code), Counter())
        notes = Counter(x for r, _ in results if r.mode == code for x in r.notes)
        dup = sum(r.duplicates for r, _ in results if r.mode == code)
        print(f"\n{code}: decisions {dict(mix.most_common())}; decisions beyond one a page "
              f"{dup}; WARNING/ERROR lines {sum(notes.values())}")
        for note, count in notes.most_common(8):
            print(f"    {count:4d} x {note}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or ""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split(
        "\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", metavar="REV", help="an older checkout (directory) or git "
                    "revision, measured in the same rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rates", default="300,800", metavar="LIST", help="pages/s offered")
    ap.add_argument("--kinds", default=",".join(KINDS), metavar="LIST", help=", ".join(KINDS))
    ap.add_argument("--max-kb", type=float, default=64,
                    help="largest corpus body used, kB (64; smaller pages cost less to decide)")
    ap.add_argument("--seconds", type=float, default=8.0, help="each rate's window (8)")
    ap.add_argument("--warm-pages", type=int, default=100, metavar="N",
                    help="pages decided before the window (100)")
    ap.add_argument("--warm-up-seconds", type=float, default=8.0, metavar="S",
                    help="each code once at the highest rate first, not counted (8; 0: none)")
    ap.add_argument("--near-lag", type=int, default=41, metavar="N",
                    help="a near-duplicate follows its page by N pages (41; made odd)")
    ap.add_argument("--workers", type=int, default=1, help="serve --workers (1)")
    ap.add_argument("--batch-size", type=int, metavar="N", help="serve --batch-size")
    ap.add_argument("--exactly-once", action="store_true",
                    help="serve --exactly-once (\"sent\" is then before the transaction "
                    "commits; \"visible\" after)")
    ap.add_argument("--bootstrap", metavar="HOST:PORT", help="a running broker to use")
    ap.add_argument("--logs", type=Path, metavar="DIR", help="keep the service logs here")
    args = ap.parse_args(argv)
    args.rate_list = [float(r) for r in args.rates.split(",") if r.strip()]
    args.kind_list = [k for k in args.kinds.split(",") if k]
    if not args.rate_list or set(args.kind_list) - set(KINDS) or args.rounds < 1:
        ap.error(f"--rates must name a rate, --kinds some of {KINDS}, --rounds >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work, logs = workdir("stream-dedup-latency-", args.logs)
    started = time.perf_counter()
    print(header("## page-to-decision latency through Kafka (bench/latency.py)"))
    codes = {"this": REPO}
    made = None
    if args.before:
        codes["before"], was_made = checkout(args.before, work)
        made = codes["before"] if was_made else None
    for name, path in codes.items():
        rev = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%h %cd",
                              "--date=iso"], capture_output=True, text=True).stdout.strip()
        print(f"- {name}: {path} ({rev})")
    bodies = corpus_bodies(int(args.max_kb * 1024))
    mean_kb = sum(len(b) for b, _ in bodies) / len(bodies) / 1e3
    print(f"- pages: {len(bodies)} distinct corpus bodies of 1-{args.max_kb:g} kB, text "
          f"mostly ASCII letters (mean {mean_kb:.1f} kB), letters permuted per page; "
          f"serve --workers {args.workers}{' --exactly-once' if args.exactly_once else ''}; "
          f"logs in {logs}")
    broker = Broker(None, args.bootstrap) if args.bootstrap else Broker.start(work / "kafka")
    print(f"- broker: {broker.bootstrap}\n", flush=True)
    ctx = Context(broker, args, bodies, codes, logs, uuid.uuid4().hex[:6])
    results = []
    try:
        if args.warm_up_seconds:
            for name in codes:
                run_phase(ctx, name, 0, args.kind_list[0], max(args.rate_list),
                          args.warm_up_seconds)
        for rnd in range(1, args.rounds + 1):
            order = list(codes) if rnd % 2 else list(codes)[::-1]
            for rate in args.rate_list:
                for kind in args.kind_list:
                    for name in order:
                        results.append(run_phase(ctx, name, rnd, kind, rate, args.seconds))
    finally:
        broker.stop()
        if made is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(made)], capture_output=True)
        shutil.rmtree(work / "kafka", ignore_errors=True)
    report(results, args, list(codes))
    print(f"\nrun took {(time.perf_counter() - started) / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
