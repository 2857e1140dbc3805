"""SIGTERM to `stream-dedup serve`'s process group, as Kubernetes sends it, at any moment:
while the modules load, while the index is restored from a big changelog, while the group
is joined, in a rebalance (a second instance joining). Every time: exit code 0 within the
grace, no "never retrieved" future in the log, and the shutdown deadline (runner/signals.py) never
reached. At-least-once, a SIGTERM repeats nothing (test_service.py checks the decisions)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer
from opskit import wait_for
from test_exactly_once import _fill, crawl, read_committed
from test_service import (
    Service,
    decisions_of,
    names,
    service,  # noqa: F401  (the fixture)
)

from stream_dedup import Deduplicator, Settings
from stream_dedup.cli.sample import build
from stream_dedup.index.base import Change
from stream_dedup.kafka import changelog as cl
from stream_dedup.models import Page

pytestmark = pytest.mark.kafka

GRACE_S = 25.0  # a Kubernetes pod's default grace is 30 s
BIG_CHANGELOG = 40_000  # records: a restore of a few seconds here


def term(svc: Service, grace: float = GRACE_S) -> int:
    """SIGTERM to the process group; the exit code, within `grace` (else the test fails)."""
    os.killpg(svc.proc.pid, signal.SIGTERM)
    try:
        return svc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pytest.fail(f"not stopped {grace:.0f} s after SIGTERM:\n{svc.text()[-4000:]}")


def clean_exit(svc: Service, rc: int) -> None:
    text = svc.text()
    assert rc == 0, f"rc {rc}:\n{text[-4000:]}"
    assert "never retrieved" not in text, text[-4000:]
    assert "shutdown did not finish" not in text, text[-4000:]
    # One traceback is expected: with --workers, a SIGTERM to the group while the
    # forkserver starts (before it ignores the stop signals: workers/pool.py) kills it, and the
    # pool says so (pipeline/analysis.py) and analyses in the deciding thread meanwhile
    tracebacks = text.count("Traceback")
    known = text.count("the analysis worker processes did not start")
    assert tracebacks <= known, text[-4000:]


@pytest.fixture(scope="module")
def big_changelog(kafka_bootstrap: str) -> Iterator[str]:
    """A changelog topic of BIG_CHANGELOG kept pages (real documents, shingles left out),
    in batches of 100."""
    dd = Deduplicator(Settings())
    dd.journal = []
    pages = [Page(url=p.url, body=p.html.encode(), headers=(("Content-Type", "text/html"),),
                  position=i) for i, p in enumerate(build(seed=60))]
    dd.check_batch(pages, redeliveries=False)
    docs = [c.doc for c in dd.take_journal()]
    dd.close()
    topic = names("bigcl")["input"] + "-changelog"
    from test_rebalance import create_topic

    create_topic(kafka_bootstrap, topic, **{"cleanup.policy": "compact"})

    async def fill() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=20,
                                    max_batch_size=512 * 1024)
        await producer.start()
        try:
            acks = []
            for i in range(BIG_CHANGELOG):
                doc = dataclasses.replace(docs[i % len(docs)], page_id=1 << 40 | i,
                                          url_key=1 << 50 | i, shingles=b"",
                                          url=f"https://big.example/{i}")
                for key, value, headers in cl.records([Change(doc)], f"big/0/{i // 100}"):
                    acks.append(await producer.send(topic, value, key=key,
                                                    headers=list(headers), partition=0))
            await asyncio.gather(*acks)
        finally:
            await producer.stop()
    asyncio.run(fill())
    yield topic


def _rounds(request: pytest.FixtureRequest, quick: int) -> int:
    return int(os.environ.get("STREAM_DEDUP_TEST_SIGTERM_ROUNDS", quick))


@pytest.mark.parametrize("mode", ["exactly-once", "at-least-once", "workers"])
def test_sigterm_at_start_up_exits_0(kafka_bootstrap: str, service, big_changelog: str,  # type: ignore[no-untyped-def]  # noqa: F811
                                     request: pytest.FixtureRequest, mode: str) -> None:
    """SIGTERM at a random moment of the first seconds: loading the modules, restoring the
    big changelog (exactly-once), joining the group, the first batches."""
    rng = random.Random(f"4301-{mode}")
    pages = crawl(range(60, 61))
    t = _fill(kafka_bootstrap, pages)
    args = ["--batch-size", "20"]
    if mode == "exactly-once":
        args += ["--exactly-once", "--changelog-topic", big_changelog]
    if mode == "workers":  # at-least-once, its analysis pool starting or at work
        args += ["--workers", "2"]
    phases: dict[str, int] = {}
    for round_ in range(_rounds(request, 6)):
        t = {**t, "group": names("g")["group"]}  # from the start each time
        svc = service(t, *args, log=f"run{round_}.log", own_group=True)
        # From 0.5 s: the interpreter's own start (0.2-0.3 s here) is before any of our
        # code can handle the signal (runner/signals.py)
        time.sleep(rng.uniform(0.5, 5.0))
        text = svc.text()
        phase = ("loading" if "stream-dedup serve:" not in text else
                 "restoring" if "restoring the index" in text and "restored" not in text else
                 "joining" if "partitions assigned: ['" not in text else "consuming")
        phases[phase] = phases.get(phase, 0) + 1
        clean_exit(svc, term(svc))
    print("rounds by phase at the signal:", phases)


@pytest.mark.slow
def test_sigterm_during_restore_exits_0(kafka_bootstrap: str, service, big_changelog: str,  # type: ignore[no-untyped-def]  # noqa: F811
                                        request: pytest.FixtureRequest) -> None:
    """The signal once the restore has begun, every round."""
    t = _fill(kafka_bootstrap, crawl(range(60, 61))[:20])
    for round_ in range(_rounds(request, 4)):
        t = {**t, "group": names("g")["group"]}
        svc = service(t, "--exactly-once", "--changelog-topic", big_changelog,
                      log=f"run{round_}.log", own_group=True)
        wait_for("the restore", lambda s=svc: "restoring the index" in s.text(), 60)
        time.sleep(random.uniform(0.0, 0.5))
        clean_exit(svc, term(svc))


@pytest.mark.parametrize("mode", ["exactly-once", "at-least-once", "workers"])
def test_sigterm_during_a_rebalance_exits_0(kafka_bootstrap: str, service,  # type: ignore[no-untyped-def]  # noqa: F811
                                            request: pytest.FixtureRequest, mode: str) -> None:
    """Three partitions, pages flowing; a second instance joins; the first (or the second)
    is sent SIGTERM while the group rebalances. Both exit 0 in time, every round."""
    rng = random.Random(f"4401-{mode}")
    args = ["--batch-size", "10", *(["--exactly-once"] if mode == "exactly-once" else []),
            *(["--workers", "2"] if mode == "workers" else [])]
    for round_ in range(_rounds(request, 3)):
        pages = crawl(range(60, 63))
        t = _fill(kafka_bootstrap, pages, partitions=3)
        first = service(t, *args, log=f"a{round_}.log", own_group=True)
        wait_for("some decisions", lambda t=t: len(read_committed(
            kafka_bootstrap, t["decisions"])) >= 20, 60)
        second = service(t, *args, log=f"b{round_}.log", own_group=True)
        victim, other = (first, second) if round_ % 2 == 0 else (second, first)
        wait_for("the rebalance", lambda a=first, b=second: re.search(
            r"partitions revoked: \['", a.text()) is not None or
            "partitions assigned: ['" in b.text(), 60)
        time.sleep(rng.uniform(0.0, 1.0))
        clean_exit(victim, term(victim))
        time.sleep(rng.uniform(0.0, 2.0))  # the survivor rebalances again: signal it too
        clean_exit(other, term(other))
        if mode != "exactly-once":  # a SIGTERM repeats nothing (a refused commit may)
            sources = [d["source"] for d in decisions_of(kafka_bootstrap, t["decisions"])]
            repeated = len(sources) - len(set(sources))
            refused = "commit refused" in first.text() + second.text()
            assert repeated == 0 or refused, (round_, repeated)


class _StopSwallowsACancel:
    """A client whose stop() goes on once after being cancelled (as a consumer's stop
    waiting for its coordination task inside a rebalance can), then ends at the next."""

    def __init__(self) -> None:
        self.cancels = 0

    async def stop(self) -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancels += 1
                if self.cancels > 1:
                    raise


def test_closing_a_client_is_bounded_even_if_its_stop_ignores_a_cancel() -> None:
    """stop_within gives up on such a client within its bound (it used asyncio.wait_for,
    which after the timeout waits for the cancelled stop to end: here, for ever)."""
    from stream_dedup.kafka.client import stop_within

    loop = asyncio.new_event_loop()
    try:
        client = _StopSwallowsACancel()
        closing = loop.create_task(stop_within(client, 0.2))  # type: ignore[arg-type]
        started = time.monotonic()
        loop.run_until_complete(asyncio.wait({closing}, timeout=5))
        assert closing.done(), "stop_within still waiting after 5 s"
        assert time.monotonic() - started < 3.0
        for task in asyncio.all_tasks(loop):  # the stop left behind ends at a 2nd cancel
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0.1))
    finally:
        loop.close()
