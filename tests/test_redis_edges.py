"""Edges of the Redis index an adversarial review found, each against a real cluster: a
batch retried after an outage, old crawl times under retention, a batch that fills a
posting list, stale members, a long wait, and a ranking the batch's own pages change."""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest
from indexkit import flush_redis

from stream_dedup import Settings
from stream_dedup.decide.step import decide_batch
from stream_dedup.decide.verdicts import Analysis
from stream_dedup.errors import IndexUnavailable
from stream_dedup.index import contain_options, index_for
from stream_dedup.index.base import Claim
from stream_dedup.index.redis.backend import RedisIndex
from stream_dedup.metrics import Metrics
from stream_dedup.models import Decision, Page, position_id
from stream_dedup.pipeline.deduplicator import Analyzer, Deduplicator
from stream_dedup.pipeline.rounds import page_probe

HTML = (("Content-Type", "text/html"),)
TEXT = " ".join(f"word{i}" for i in range(400))
NEAR = TEXT.replace("word200", "changed")


def page(url: str, text: str, position: int | None = None) -> Page:
    return Page(url, f"<p>{text}</p>".encode(), HTML, source=url, position=position)


@pytest.fixture
def url(redis_url: str) -> str:
    flush_redis(redis_url)
    return redis_url


def test_a_batch_retried_after_an_outage_keeps_its_page_ids(url: str) -> None:
    """Replay pages have no input position: a retried batch must not get new ids, or its
    pages already kept under the old ones would be dropped as copies of themselves."""
    dd = Deduplicator(Settings(index="redis", redis_url=url))
    batch = [page(f"http://x/{i}", f"{TEXT} {i} " + " ".join(f"u{i}x{j}" for j in range(200)))
             for i in range(6)] + [page("http://x/near", NEAR)]
    claim, failed = dd.index.claim, []

    def claim_then_fail(claims: list[Claim]) -> list[bool]:  # the keeps land, then Redis goes
        won = claim(claims)
        if not failed:
            failed.append(True)
            raise IndexUnavailable("Redis claim failed: TimeoutError")
        return won

    dd.index.claim = claim_then_fail  # type: ignore[method-assign]
    with pytest.raises(IndexUnavailable):
        dd.check_batch(batch)
    decisions = dd.check_batch(batch)  # what the runner does
    kept = {d.page_id: d.url for d in decisions if d.decision == "keep"}
    assert [d.decision for d in decisions][:6] == ["keep"] * 6
    for d in decisions:
        assert d.duplicate_of is None or (d.duplicate_of.url != d.url
                                          and kept[d.duplicate_of.page_id] == d.duplicate_of.url)


@pytest.mark.parametrize("age_days", [0.0, 40.0, -400.0, None])
def test_pages_crawled_before_the_window_are_still_deduplicated(url: str,
                                                                 age_days: float | None) -> None:
    """--retention-days 30, three copies of one page whose crawl time is now, 40 days ago,
    in the future, or 0 (a record without a timestamp): kept once."""
    dd = Deduplicator(Settings(index="redis", redis_url=url, retention_days=30))
    now = int(time.time() * 1000)
    ts = 0 if age_days is None else now - int(age_days * 86_400_000)
    out = [dd.check_batch([page(f"http://x/{i}", TEXT, position_id(ts, 0, i))])[0]
           for i in range(3)]
    assert [(d.decision, d.reason) for d in out] == [("keep", "unique"), ("drop", "exact"),
                                                     ("drop", "exact")]


@pytest.mark.parametrize("n", [79, 80, 200])
def test_a_batch_that_fills_a_posting_list_still_sees_the_stored_page(url: str,
                                                                      n: int) -> None:
    """n copies of a near-duplicate of a stored page in one batch: as the memory index
    decides them (all dropped against the stored page), however many."""
    now = int(time.time() * 1000)
    stored = page("http://x/s", TEXT, position_id(now, 0, 0))
    batch = [page(f"http://x/n{i}", NEAR, position_id(now + 1, 1, i)) for i in range(n)]
    got = {}
    for name, settings in (("memory", Settings()),
                           ("redis", Settings(index="redis", redis_url=url))):
        dd = Deduplicator(settings)
        dd.check_batch([stored])
        got[name] = Counter((d.decision, d.reason) for d in dd.check_batch(batch))
    assert got["redis"] == got["memory"] == {("drop", "near"): n}


def test_members_whose_lease_ran_out_do_not_hide_a_kept_copy(url: str) -> None:
    """An instance registered 40 copies of a short page and died: the copies' leases run
    out, and later copies still find the one that is kept."""
    settings = Settings(index="redis", redis_url=url)
    body = "Page not found"  # short: exact layers only
    dead = RedisIndex(url, settings.params.stamp, **contain_options(settings))
    dead.leases.lease_ms = 1
    a = Analyzer(settings).analyze(page("http://x/dead", body))
    dead.lookup([page_probe(a, pid, 0) for pid in dead.local_ids(40)])
    dead.leases.close(release=False)  # killed: nothing renewed, nothing released
    time.sleep(0.05)
    first = Deduplicator(settings).check_batch([page("http://x/a", body)])[0]
    second = Deduplicator(settings).check_batch([page("http://x/b", body)])[0]
    assert (first.decision, (second.decision, second.reason)) == ("keep", ("drop", "exact"))


def test_a_page_waits_for_an_older_one_as_long_as_it_takes(url: str) -> None:
    """An older near-duplicate pending on another instance for 2 s: the page waits (not
    'index unavailable' after a fraction of a second), then is decided against it."""
    settings = Settings(index="redis", redis_url=url)
    now = int(time.time() * 1000)
    older = page("http://x/q", TEXT, position_id(now, 0, 0))
    other = RedisIndex(url, settings.params.stamp, **contain_options(settings))
    qa = Analyzer(settings).analyze(older)
    assert older.position is not None
    other.lookup([page_probe(qa, older.position, 0)])  # registered: pending on the other instance

    def finish_later() -> None:
        time.sleep(2.0)
        answers = other.lookup([page_probe(qa, older.position, 0)])
        v = decide_batch([qa], [older.position], answers, settings)[0]
        assert other.claim([Claim(page_probe(qa, older.position, 0), v.doc, v.decision)]) == [True]

    thread = threading.Thread(target=finish_later)
    thread.start()
    started = time.monotonic()
    metrics = Metrics(settings, process=False)
    d = Deduplicator(settings, observer=metrics).check_batch([page("http://x/p", NEAR,
                                                 position_id(now + 5, 1, 0))])[0]
    thread.join()
    assert time.monotonic() - started >= 1.9
    assert metrics.redis_waits._value.get() >= 2  # rounds it waited, exported
    assert (d.decision, d.duplicate_of and d.duplicate_of.url) == ("drop", "http://x/q")


def test_a_ranking_the_batch_changes_reads_only_records_it_has(url: str) -> None:
    """Full posting lists (max_posting 2) that the batch's own kept pages push stored
    candidates out of: the decide step may then rank a candidate the index's own ranking
    left out; Redis decides as memory does (before: a KeyError). (The pages are made by
    hand: 6 features, no shingle sets, so no containment keys.)"""
    settings = Settings(max_posting=2, contain_min=0)
    rng = np.random.default_rng(1)
    now = int(time.time() * 1000)

    def analysis(name: str, feats: list[int]) -> Analysis:
        return Analysis(Page("http://x/" + name, name.encode()), int(rng.integers(1 << 62)),
                        int(rng.integers(1 << 62)), 1000, 500,
                        rng.integers(0, 1 << 32, 84, dtype=np.uint64).astype(np.uint32),
                        np.array(feats, dtype=np.uint64), bytes(30))

    def uniq() -> int:
        return int(rng.integers(1 << 62))

    pages = [(analysis(n, [f, *(uniq() for _ in range(5))]), position_id(now, 0, i))
             for i, (n, f) in enumerate([("A", 111), ("B", 111), ("C", 222), ("D", 333)])]
    last = [(analysis("O", [111, *(uniq() for _ in range(5))]), position_id(now, 0, 10)),
            (analysis("P", [111, 222, 333, *(uniq() for _ in range(3))]), position_id(now, 0, 11))]
    results = {}
    for name, index in (("memory", index_for(settings)),
                        ("redis", RedisIndex(url, settings.params.stamp, settings.max_posting,
                                                   **contain_options(settings)))):
        out: list[Decision] = []
        for batch in [[p] for p in pages] + [last]:
            probes = [page_probe(a, pid, 0) for a, pid in batch]
            verdicts = decide_batch([a for a, _ in batch], [pid for _, pid in batch],
                                    index.lookup(probes), settings)
            index.claim([Claim(pr, v.doc, v.decision, v.depends_on)
                         for pr, v in zip(probes, verdicts, strict=True)])
            out += [v.decision for v in verdicts]
        results[name] = [(d.decision, d.reason) for d in out]
    assert results["redis"] == results["memory"]


def test_many_instances_start_at_once(url: str) -> None:
    """Eight indexes opened at the same moment (the first connection of redis-py's cluster
    client has had bugs): each maps the cluster, loads the scripts, agrees on the stamp."""
    settings = Settings()
    opened: list[RedisIndex] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def open_one() -> None:
        barrier.wait()
        try:
            opened.append(RedisIndex(url, settings.params.stamp, **contain_options(settings)))
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(opened) == 8
    assert all(index.ping() for index in opened)
    for index in opened:
        index.close()


def test_records_with_shingle_sets_in_the_index_redis_are_warned_about(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Exact verification's sets (~5 KB a mean page) in the index's own Redis RAM: said
    at start, with the two ways out; not with a records store or with --no-verify-exact."""
    for settings, warned in ((Settings(index="redis", redis_url=url), True),
                             (Settings(index="redis", redis_url=url, verify_exact=False), False),
                             (Settings(index="redis", redis_url=url, redis_records_url=url),
                              False)):
        caplog.clear()
        index_for(settings).close()
        said = [r.getMessage() for r in caplog.records if "shingle set" in r.getMessage()]
        assert bool(said) == warned, settings
        if warned:
            assert "--redis-records-url" in said[0] and "--no-verify-exact" in said[0]


def test_a_stop_ends_a_wait_on_a_live_instance_after_the_grace(url: str) -> None:
    """A page waits for an older one a live instance holds (its lease renewed); a stop
    gives the wait STOP_GRACE_S, then the batch is abandoned uncommitted, and the pages it
    held are released: nobody waits for them."""
    import asyncio

    from stream_dedup.runner.edges import STOP_GRACE_S, ListSink, ListSource
    from stream_dedup.runner.loop import Runner

    settings = Settings(index="redis", redis_url=url, batch_size=10)
    now = int(time.time() * 1000)
    older = page("http://x/q", TEXT, position_id(now, 0, 0))
    other = RedisIndex(url, settings.params.stamp, **contain_options(settings))
    qa = Analyzer(settings).analyze(older)
    assert older.position is not None
    other.lookup([page_probe(qa, older.position, 0)])  # pending there, for as long as it lives
    dd = Deduplicator(settings)
    young = page("http://x/p", NEAR, position_id(now + 5, 1, 0))
    source, sink = ListSource({"pages/0": [young]}), ListSink()
    runner = Runner(settings, dd, source, sink, inline=False)

    async def run() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        await asyncio.sleep(1.0)  # waiting by now
        stop.set()
        stopped = time.monotonic()
        await asyncio.wait_for(task, 30)
        return time.monotonic() - stopped

    took = asyncio.run(run())
    assert STOP_GRACE_S - 0.5 <= took <= STOP_GRACE_S + 3, took
    assert runner.stats.abandoned == 1 and not sink.decisions
    assert young.position not in dd.index.leases.held()
    # released: the older page's instance sees nothing pending from this one
    record = other.client.hget(*_split(other.layout.record_key(position_id(now + 5, 1, 0))))
    assert record is not None and record[:1] == b"P"
    assert int(record[5 + 6:].rstrip(b"f")) == 0  # its lease ended when released
    dd.close()
    other.close()


def _split(key: bytes) -> tuple[bytes, bytes]:
    at = key.index(b"}") + 5
    return key[:at], key[at:]
