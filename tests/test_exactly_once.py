"""`serve --exactly-once`: decisions equal an uninterrupted run after crashes at every step
of a batch, on every backend; outputs are seen once by read_committed readers; a zombie is
fenced; the changelog restores an index to the state it had (kafka/transactions.py,
kafka/changelog.py). Broker tests talk to a real broker (conftest.py's kafka_bootstrap)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opskit import wait_for
from schemakit import decision_of
from test_poison import own_broker  # noqa: F401  (a fixture)
from test_service import (
    committed_and_end,
    create_topics,
    names,
    page_message,
    service,  # noqa: F401  (the fixture)
)

from stream_dedup import Deduplicator, Settings
from stream_dedup.cli.sample import build
from stream_dedup.kafka import changelog as cl
from stream_dedup.models import Page

HTML_SPARE = "<html><body><p>{}</p></body></html>"


def crawl(seeds: range = range(60, 63)) -> list[tuple[str, str]]:
    """(url, html) of synthetic pages with exact, canonical and near-duplicates, and after
    the first 100, recrawls of 24 of their URLs: the same page again, or other text."""
    pages = [(p.url, p.html) for seed in seeds for p in build(seed=seed)]
    seen: set[str] = set()
    pages = [p for p in pages if not (p[0] in seen or seen.add(p[0]))]  # type: ignore[func-returns-value]
    again = [(url, html if i % 2 else HTML_SPARE.format(
        " ".join(f"changed text number {i} word {w}" for w in range(60))))
        for i, (url, html) in enumerate(pages[:48:2])]
    return pages[:100] + again + pages[100:]


def key(d: dict[str, Any]) -> tuple[Any, ...]:
    """What must be equal between runs (ids aside: a Kafka page's id is its position)."""
    dup, prev = d.get("duplicate_of"), d.get("previous")
    return (d["url"], d["decision"], d["reason"], dup and dup["url"], d.get("resemblance"),
            prev and prev.get("match"))


def uninterrupted(pages: list[tuple[str, str]]) -> list[tuple[Any, ...]]:
    dd = Deduplicator(Settings())
    try:
        return [key(dd.check_html(url, html).to_dict()) for url, html in pages]
    finally:
        dd.close()


# --- the changelog, in process ------------------------------------------------------------
def _consumed(records: list[cl.Record], first: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(offset=first + i, key=k, value=v, headers=list(h))
            for i, (k, v, h) in enumerate(records)]


@pytest.mark.parametrize("backend", ["memory", "lsm"])
def test_a_restored_index_decides_as_the_live_one(backend: str, tmp_path: Path) -> None:
    """Decide half a crawl (recrawls included) with the changelog kept; claim it again into
    a fresh index; both decide the rest alike, and hold the same pages."""
    def settings(name: str) -> Settings:
        return Settings(index=backend, index_path=str(tmp_path / name) if backend == "lsm"
                        else "")

    pages = [Page(url=u, body=h.encode(), headers=(("Content-Type", "text/html"),),
                  position=i) for i, (u, h) in enumerate(crawl())]
    live = Deduplicator(settings("live"))
    live.journal = []
    log: list[SimpleNamespace] = []
    half = len(pages) * 2 // 3
    for start in range(0, half, 25):
        live.check_batch(pages[start:min(start + 25, half)], redeliveries=False)
        live.commit()
        log += _consumed(cl.records(live.take_journal(), f"p/0/{start}"), len(log) + start)
    assert any(v.value is None for v in log)  # recrawls replaced versions: tombstones
    restored = Deduplicator(settings("restored"))
    from stream_dedup.index.base import LocalIndex

    assert isinstance(restored.index, LocalIndex)
    for docs, _, _ in cl.changes(log):
        cl.claim_again(restored.index, docs)
    assert len(restored.index) == len(live.index)
    rest = pages[half:]
    a = [d.to_dict() for d in live.check_batch(rest, redeliveries=False)]
    b = [d.to_dict() for d in restored.check_batch(rest, redeliveries=False)]
    assert [key(d) for d in a] == [key(d) for d in b]
    assert {d["decision"] for d in a} == {"keep", "drop"}
    live.close()
    restored.close()


def test_changelog_batches_are_cut_at_the_batch_header() -> None:
    records = [(b"k1", b"x", (("stream-dedup-batch", b"a"),)),
               (b"k2", None, (("stream-dedup-batch", b"a"),)),
               (b"k3", b"y", (("stream-dedup-batch", b"b"),))]
    consumed = _consumed(records, 10)
    cut = [(len(docs), end) for docs, _, end in cl.changes(
        SimpleNamespace(**{**vars(r), "value": None}) for r in consumed)]
    assert cut == [(0, 12), (0, 13)]


# --- through a real broker ----------------------------------------------------------------
def read_committed(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    out = subprocess.run(["kcat", "-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e",
                          "-J", "-q", "-X", "isolation.level=read_committed"],
                         capture_output=True, timeout=60)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def _fill(bootstrap: str, pages: list[tuple[str, str]], partitions: int = 1
          ) -> dict[str, str]:
    from test_service import kcat_produce

    t = names("eo")
    create_topics(bootstrap, [t["input"]], partitions=partitions)
    kcat_produce(bootstrap, t["input"], [(u, json.dumps({"url": u, "html": h}).encode())
                                         for u, h in pages])
    return t


def _all_decided(bootstrap: str, t: dict[str, str], n: int, timeout: float = 120
                 ) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []

    def done() -> bool:
        got[:] = [decision_of(m["payload"]) for m in read_committed(bootstrap, t["decisions"])]
        return len({d["source"] for d in got}) >= n
    wait_for(f"{n} decisions", done, timeout)
    return got


def check_exactly_once(bootstrap: str, t: dict[str, str], pages: list[tuple[str, str]],
                       partitions: int = 1) -> list[dict[str, Any]]:
    """One decision a record, the kept topic = the kept pages once each; on one partition,
    the decisions of an uninterrupted run."""
    got = _all_decided(bootstrap, t, len(pages))
    sources = [d["source"] for d in got]
    assert len(sources) == len(set(sources)) == len(pages)  # nothing repeated, nothing lost
    kept = read_committed(bootstrap, t["kept"])
    keeps = sorted(d["url"] for d in got if d["decision"] == "keep")  # a changed URL: twice
    assert sorted(m["key"] for m in kept) == keeps
    ids = {d["page_id"] for d in got if d["decision"] == "keep"}
    assert all(d["duplicate_of"]["page_id"] in ids for d in got if d.get("duplicate_of"))
    if partitions == 1:
        got.sort(key=lambda d: int(d["source"].rsplit("/", 1)[1]))
        assert [key(d) for d in got] == uninterrupted(pages)
    return got


def _backend(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    if name == "lsm":
        return ["--index", "lsm", "--index-path", str(tmp_path / "index")]
    if name == "redis":
        from indexkit import flush_redis

        url = request.getfixturevalue("redis_url")
        flush_redis(url)
        return ["--index", "redis", "--redis-url", url]
    return []


POINTS = ["before-deliver", "before-transaction-commit", "before-index-commit",
          "before-source-commit"]


@pytest.mark.parametrize("backend", [
    "memory", "lsm", pytest.param("redis", marks=pytest.mark.redis)])
@pytest.mark.parametrize("point", POINTS)
def test_a_crash_at_any_step_changes_no_decision(
        kafka_bootstrap: str, service, tmp_path: Path, request: pytest.FixtureRequest,  # type: ignore[no-untyped-def]  # noqa: F811
        backend: str, point: str) -> None:
    pages = crawl()
    t = _fill(kafka_bootstrap, pages)
    args = ["--exactly-once", "--batch-size", "40", *_backend(backend, tmp_path, request)]
    crashed = service(t, *args, "--crash-at", f"{point}:3", log="crash.log")
    assert crashed.wait(timeout=120) == 70
    before = [decision_of(m["payload"]) for m in read_committed(kafka_bootstrap,
                                                                 t["decisions"])]
    final = service(t, *args, log="final.log")
    check_exactly_once(kafka_bootstrap, t, pages)
    assert final.stop() == 0
    if backend == "redis":
        return
    # What the final run claimed from the changelog: the memory index starts empty, so
    # every page the crashed run kept in a committed transaction; the LSM index holds what
    # it committed, so only the third batch's kept pages when the crash came between that
    # batch's transaction and the index's commit, else none.
    restored = sum(int(n) for n in re.findall(r"restored (\d+) kept pages", final.text()))
    kept_before = sum(d["decision"] == "keep" for d in before)
    if backend == "memory":
        assert restored == kept_before > 0
    elif point == "before-index-commit":
        assert 0 < restored < kept_before
    else:
        assert restored == 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", "lsm"])
def test_sigkills_mid_stream_change_no_decision(
        kafka_bootstrap: str, service, tmp_path: Path, request: pytest.FixtureRequest,  # type: ignore[no-untyped-def]  # noqa: F811
        backend: str) -> None:
    """The issue's trial: SIGKILL three times at random moments while pages flow."""
    import random

    pages = crawl(range(60, 70))
    t = _fill(kafka_bootstrap, pages)
    # Batches of 2: ~350 transactions, several seconds a run (with 10 or more, the first
    # run had decided all 704 records before the test saw its first commit)
    args = ["--exactly-once", "--batch-size", "2", *_backend(backend, tmp_path, request)]
    rng = random.Random(2801)

    def decided() -> int:
        """Records whose transactions committed: the group's committed offset (kcat, reading
        read_committed, waits while transactions keep coming: it saw nothing until the end)"""
        return committed_and_end(kafka_bootstrap, t["input"], t["group"])[0]

    done = 0
    for round_ in range(3):
        svc = service(t, *args, log=f"run{round_}.log")
        # Each kill lands mid-stream: once this run has committed something, and before
        # it has decided every record.
        wait_for("this run's first commits", lambda n=done: decided() > n, 60)
        time.sleep(rng.uniform(0.0, 0.5))
        svc.stop(signal.SIGKILL)
        progress, done = done, decided()
        assert progress < done < len(pages), (round_, progress, done, len(pages))
    final = service(t, *args, log="final.log")
    check_exactly_once(kafka_bootstrap, t, pages)
    # The killed runs may have decided every page: stopped before its signal handlers are
    # set (still importing), the last one would die of the SIGTERM instead of exiting 0.
    wait_for("consuming", lambda: "partitions assigned" in final.text())
    assert final.stop() == 0


def test_a_poison_record_inside_a_transaction_is_one_dead_letter(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from test_service import kcat_produce

    pages = crawl(range(60, 61))
    t = _fill(kafka_bootstrap, pages[:30])
    kcat_produce(kafka_bootstrap, t["input"], [("http://bad.example/", b"{not json")])
    kcat_produce(kafka_bootstrap, t["input"], [page_message(p) for p in build(seed=61)[:10]])
    svc = service(t, "--exactly-once", "--batch-size", "500")
    got = _all_decided(kafka_bootstrap, t, 41)
    assert svc.stop() == 0
    assert len(got) == 41 and sum(d["decision"] == "reject" for d in got) == 1
    dead = read_committed(kafka_bootstrap, t["dead"])
    assert len(dead) == 1 and dead[0]["payload"] == "{not json"


@pytest.mark.slow
def test_a_stalled_instance_is_fenced_and_nothing_of_it_is_seen(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The first instance stalls 25 s with its third batch sent, its transaction open (a
    zombie: its session expires). A second instance gets the partition; its producer fences
    the first's and aborts that transaction. Woken up, the first fails to commit, and starts
    over. Every record has one decision, as in an uninterrupted run."""
    pages = crawl(range(60, 64))
    t = _fill(kafka_bootstrap, pages)
    args = ["--exactly-once", "--batch-size", "20"]
    first = service(t, *args, "--crash-at", "before-transaction-commit:3:25", log="first.log")
    wait_for("the first instance's stall", lambda: len(read_committed(
        kafka_bootstrap, t["decisions"])) >= 40, 60)
    second = service(t, *args, log="second.log")
    check_exactly_once(kafka_bootstrap, t, pages)
    wait_for("the first instance to wake", lambda: "starting over" in first.text(), 60)
    assert "ProducerFenced" in first.text() or "InvalidProducerEpoch" in first.text()
    assert first.stop() == 0 and second.stop() == 0


@pytest.mark.slow
def test_a_transaction_past_its_timeout_is_aborted_and_decided_again(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The broker aborts a transaction open longer than --transaction-timeout-s (it looks
    for them every 10 s: transaction.abort.timed.out.transaction.cleanup.interval.ms): the
    service's commit fails, it starts over, and the batch is decided again, once."""
    pages = crawl(range(60, 62))
    t = _fill(kafka_bootstrap, pages)
    svc = service(t, "--exactly-once", "--batch-size", "20", "--transaction-timeout-s", "2",
                  "--crash-at", "before-transaction-commit:2:14")
    check_exactly_once(kafka_bootstrap, t, pages)
    assert "starting over" in svc.text()
    assert svc.stop() == 0


@pytest.mark.slow
def test_a_broker_restart_mid_transaction_changes_no_decision(
        own_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The third batch's transaction is open (its outputs sent; the service stalled there
    for 30 s) when the broker is stopped and started again: whether that transaction then
    commits or fails (the service starts over), every record has one decision, as in an
    uninterrupted run."""
    from test_poison import _serve

    bootstrap, broker = own_broker
    pages = crawl(range(60, 62))
    t = _fill(bootstrap, pages)
    log = tmp_path / "serve.log"
    proc = _serve(bootstrap, t, log, "--exactly-once", "--batch-size", "20", "--kept-topic",
                  t["kept"], "--crash-at", "before-transaction-commit:3:30")
    try:
        wait_for("two batches committed", lambda: len(read_committed(
            bootstrap, t["decisions"])) >= 40, 60)
        broker("stop")
        broker("start")
        check_exactly_once(bootstrap, t, pages)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "stopped after" in text


@pytest.mark.slow
def test_a_rebalance_mid_stream_keeps_every_invariant(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Three partitions; a second instance joins while the first is busy, and partitions
    move under open transactions: one decision a record, each kept page once on the kept
    topic, no drop against a page never kept."""
    import re

    from test_service import kcat_produce

    pages = crawl(range(60, 62))
    t = _fill(kafka_bootstrap, pages, partitions=3)
    args = ["--exactly-once", "--batch-size", "10"]
    first = service(t, *args, log="a.log")
    wait_for("some decisions", lambda: len(read_committed(kafka_bootstrap, t["decisions"]))
             >= 40)
    second = service(t, *args, log="b.log")
    seed, deadline = 100, time.monotonic() + 90
    while not re.search(r"partitions assigned: \['", second.text()):  # keep the first busy
        assert time.monotonic() < deadline, "the second instance never got a partition"
        more = [(p.url, p.html) for p in build(seed=seed)]
        kcat_produce(kafka_bootstrap, t["input"], [(u, json.dumps({"url": u, "html": h})
                                                    .encode()) for u, h in more])
        pages += more
        seed += 1
    check_exactly_once(kafka_bootstrap, t, pages, partitions=3)
    assert first.stop() == 0 and second.stop() == 0
    assert re.search(r"partitions revoked: \['", first.text())
