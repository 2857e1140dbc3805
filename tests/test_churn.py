"""Churn (issue 43): `serve` instances on one Redis index killed, stopped and added at random
while pages arrive, in both delivery modes; and two `replay`s on one Redis index at once,
on a loaded machine. A real broker, a real cluster. The harness is tests/churnkit.py (also
driven by bench/churn.py, which prints the figures); every wait is bounded, so a hang is a
failed assertion that names it, with the instances' log lines that explain it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from churncheck import double_keeps, problems
from churnkit import MODES, REPO, Config, Item, campaign, crawl
from indexkit import flush_redis
from racekit import group_pages

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.redis]

PAGES, PARTITIONS, INSTANCES, CHURN_S = 600, 6, 3, 20.0
REPLAY_ROUNDS = int(os.environ.get("STREAM_DEDUP_CHURN_REPLAY_ROUNDS", "5"))
REPLAY_BOUND_S = 60.0


@pytest.mark.parametrize("mode", list(MODES))
def test_churn_keeps_every_promise(kafka_bootstrap: str, redis_url: str, tmp_path: Path,
                                   mode: str) -> None:
    """3 instances, 600 pages on 6 partitions produced over 14 s while a member is
    SIGKILLed, SIGTERMed or added every 2-5 s for 20 s: every page decided (once, exactly
    once), the kept topic exact, no drop against an unkept page, no double keep, every
    SIGTERM obeyed within 40 s with rc 0, the group done within 30 s of the churn, clean
    logs."""
    seed = int(os.environ.get("STREAM_DEDUP_CHURN_SEED", "0")) or int(time.time()) % 100_000
    cfg = Config(kafka_bootstrap, redis_url, mode, crawl(PAGES, PARTITIONS, seed),
                 PARTITIONS, tmp_path, seed, instances=INSTANCES, churn_s=CHURN_S,
                 produce_s=CHURN_S * 0.7)
    res = campaign(cfg)
    print(f"{mode} seed {seed}: events {res.events}; SIGTERMs {res.terms}; done "
          f"{res.finish_s} s after the churn; {res.decided} decided, {res.repeated} repeated")
    found = problems(res)
    assert not found, (f"seed {seed} (rerun: STREAM_DEDUP_CHURN_SEED={seed}); events "
                       f"{res.events}\n" + "\n".join(found) + "\n" + res.evidence)
    assert res.counts()["kills"] + res.counts()["terms"] >= 1, "no churn happened"


# --- two replays at once --------------------------------------------------------------------
def replay_crawl(tmp: Path, groups: int = 300, synthetic: int = 600) -> tuple[
        list[Path], list[Item]]:
    """Two halves of one crawl as JSONL: groups of 4 near-duplicates, members 0 and 2 in one
    half, 1 and 3 in the other (every group races), and benchlib's synthetic pages (15 %
    near-duplicates of earlier ones) split by page number, interleaved. The synthetic pages
    have the minimal template: with the full one, pages of a site share template features,
    and one process alone keeps pairs of them sharing >= 2 (as `unique`), which the rule
    check would count."""
    sys.path.insert(0, str(REPO / "bench"))
    from benchlib import synthetic_pages

    grouped = [Item(m % 2, url, html, g) for g in range(groups)
               for m, (url, html) in enumerate(group_pages(g))]
    synth = [Item(i % 2, p.url, p.body, -1) for i, p in enumerate(
        synthetic_pages(synthetic, minimal_template=True))]
    items = [it for _, it in sorted([(i / len(grouped), it) for i, it in enumerate(grouped)]
                                    + [(i / len(synth), it) for i, it in enumerate(synth)],
                                    key=lambda pair: pair[0])]
    return halves(tmp, items), items


def containment_crawl(tmp: Path) -> tuple[list[Path], list[Item]]:
    """A crawl rich in shared containment keys (bench/containment.py's builder: 16 sites of
    20 template pages each, 60 articles, 200 excerpts of them, 80 extended copies, quotes,
    short and unrelated pages: 700), shuffled, halves by alternate page. Many containment
    keys are shared by about contain_common kept pages, so a batch's own pages change the
    candidates' ranking: the old code's lookup then lacked a record the decide step read
    (KeyError, and the instance hung: 9 rounds of 15, 2026-11-28)."""
    import random

    sys.path.insert(0, str(REPO / "bench"))
    import containment

    from stream_dedup import Settings
    from stream_dedup.pipeline.analysis import Analyzer

    args = containment.parse_args(["--seed=6", "--order-seed=4"])
    for name, value in dict(bases=60, excerpts=200, extended=80, quotes=20, short=10,
                            sites=16, site_pages=20, unrelated=10).items():
        setattr(args, name, value)
    built, _ = containment.build(args, Analyzer(Settings.load(env={})))
    pages = [it.page for it in built]
    random.Random(6).shuffle(pages)
    items = [Item(i % 2, p.url, p.body, -1) for i, p in enumerate(pages)]
    return halves(tmp, items), items


def halves(tmp: Path, items: list[Item]) -> list[Path]:
    """The items as two JSONL files, by their `partition` (0 or 1)."""
    files = []
    for half in (0, 1):
        path = tmp / f"half{half}.jsonl"
        with open(path, "w") as fh:
            for it in items:
                if it.partition == half:
                    fh.write(json.dumps({"url": it.url, "html": it.html.decode(
                        "utf-8", "replace")}) + "\n")
        files.append(path)
    return files


def replay_round(redis_url: str, files: list[Path], tmp: Path, rnd: int,
                 batch_size: int) -> tuple[float | None, list[str], list[dict[str, object]]]:
    """Both halves at once, in batches of `batch_size`, one core kept busy meanwhile:
    (seconds, or None past the bound; failures; every decision written)."""
    flush_redis(redis_url)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    procs, failures = [], []
    started = time.monotonic()
    try:
        for half, f in enumerate(files):
            log = open(tmp / f"r{rnd}-replay{half}.log", "wb")  # noqa: SIM115
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "stream_dedup", "replay", str(f), "--index", "redis",
                 "--redis-url", redis_url, "-o", str(tmp / f"r{rnd}-half{half}.jsonl"), "-q",
                 "--no-progress", "--batch-size", str(batch_size)], stdout=log,
                stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True), log))
        for half, (p, _) in enumerate(procs):
            try:
                rc = p.wait(timeout=max(0.1, started + REPLAY_BOUND_S - time.monotonic()))
                if rc != 0:
                    failures.append(f"round {rnd}: replay of half {half} exited {rc}")
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGUSR1)  # its threads' stacks, into its log
                time.sleep(1.0)
                failures.append(f"round {rnd}: replay of half {half} not done within "
                                f"{REPLAY_BOUND_S:.0f} s")
        seconds = time.monotonic() - started
    finally:
        for p, log in procs:
            _killpg(p)
            log.close()
        _killpg(busy)
    for half in range(len(procs)):
        text = (tmp / f"r{rnd}-replay{half}.log").read_text(errors="replace")
        if failures or "Traceback" in text:
            failures.append(f"--- round {rnd}, replay of half {half}, last lines:\n"
                            + "\n".join(text.splitlines()[-60:]))
    decisions = []
    for half in (0, 1):
        out = tmp / f"r{rnd}-half{half}.jsonl"
        if out.exists():
            decisions += [json.loads(line) for line in out.read_text().splitlines()
                          if line.strip().endswith("}")]
    return (None if seconds > REPLAY_BOUND_S else seconds), failures, decisions


def _killpg(p: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


@pytest.mark.parametrize("kind", ["groups", "containment"])
def test_two_replays_on_one_index_under_load(redis_url: str, tmp_path: Path,
                                             kind: str) -> None:
    """Two `replay --index redis` at once on the two halves of one crawl, a core kept busy
    by another process, 5 rounds: each done within 60 s, every page decided, and together
    no drop against a page that is not kept and (groups of near-duplicates) no double
    keep by the filter rule. (On the containment crawl one process alone keeps template
    pages of a site that share >= 2 features, as verified-distinct or unique: the rule
    check does not apply there.)"""
    files, items = (replay_crawl if kind == "groups" else containment_crawl)(tmp_path)
    by_url = {it.url: it for it in items}
    failures, times = [], []
    for rnd in range(1, REPLAY_ROUNDS + 1):
        # (small batches on the containment crawl: many batches, many races between them)
        seconds, failed, decisions = replay_round(redis_url, files, tmp_path, rnd,
                                                  500 if kind == "groups" else 20)
        times.append(seconds)
        keeps = [d for d in decisions if d["decision"] == "keep"]
        ids = {d["page_id"] for d in keeps}
        dangling = sum(d["decision"] == "drop" and d["duplicate_of"] is not None
                       and d["duplicate_of"]["page_id"] not in ids for d in decisions)
        double = double_keeps([(by_url[d["url"]], d["reason"]) for d in keeps]) \
            if kind == "groups" else 0
        if not failed and len(decisions) != len(items):
            failed.append(f"round {rnd}: {len(decisions)} decisions of {len(items)} pages")
        if dangling or double:
            failed.append(f"round {rnd}: {dangling} drops against an unkept page, {double} "
                          "double keeps")
        print(f"round {rnd}: " + ("HUNG" if seconds is None else f"{seconds:.1f} s") +
              f", {len(decisions)} decisions, {len(keeps)} keeps, {dangling} dangling, "
              f"{double} double keeps", flush=True)
        failures += failed
    assert not failures, f"round times {times}\n" + "\n".join(failures)
