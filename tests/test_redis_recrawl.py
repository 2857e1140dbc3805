"""Recrawls on the shared index (issue 26): two instances deciding two fetches of one URL at
once leave exactly one version held for it, the later one, and decide each fetch as an
uninterrupted run does (the memory index, the fetches in id order).

As in tests/test_redis_protocol.py, each test fixes an order of the two instances' steps
(lookup = register + join + peek, the pure decide step, claim). The URL holds a version V0
(kept first); `old` (the smaller page id) and `young` are two new fetches of it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_redis_protocol import (
    SETTINGS,
    analysis,
    ask,
    claim,
    decide,
    finish,
    open_two,
    page_of,
)

from stream_dedup.core.urls import UrlKeys
from stream_dedup.decide.step import decide_batch
from stream_dedup.decide.verdicts import Analysis
from stream_dedup.index import index_for
from stream_dedup.index.base import WAIT, Claim, Probe
from stream_dedup.index.redis.backend import RedisIndex
from stream_dedup.index.redis.layout import set_members
from stream_dedup.models import Decision, position_id
from stream_dedup.pipeline.rounds import page_probe

URL = "http://x.example/page"
KEY = UrlKeys().key(URL)
V0, OLD, YOUNG = position_id(900, 2, 1), position_id(1_000, 0, 5), position_id(1_001, 1, 9)


def text(seed: int) -> str:
    """Pages of unrelated text (no two near-duplicates)."""
    return " ".join(f"t{seed}w{i}x{(i * 31 + seed) % 101}" for i in range(300))


FIRST, SECOND, THIRD = (analysis(URL, text(s)) for s in (1, 2, 3))


@pytest.fixture(params=["records in the index", "records in a store"])
def two(redis_url: str, request: pytest.FixtureRequest
        ) -> Iterator[tuple[RedisIndex, RedisIndex]]:
    """Two instances on one index (as test_redis_protocol's), the URL's version V0 kept."""
    a, b = open_two(redis_url, request)
    v0 = finish(a, FIRST, V0, KEY)
    assert (v0.decision.decision, v0.decision.reason) == ("keep", "unique")
    yield a, b
    a.close()
    b.close()


def held(index: RedisIndex) -> list[tuple[int, str]]:
    """The members of the URL's set and their states (K: the version held)."""
    key = index.layout.set_key(b"u", KEY)
    out = []
    for ref in set_members(index.client.get(key[: key.index(b"}") + 5]), key):
        q = page_of(index, ref)
        assert q is not None
        record = index.layout.record_key(q)
        at = record.index(b"}") + 5
        out.append((q, (index.client.hget(record[:at], record[at:]) or b"?")[:1].decode()))
    return sorted(out)


def serial(pages: list[tuple[Analysis, int]]) -> list[Decision]:
    """The uninterrupted run: one memory index, the fetches one by one in id order."""
    index = index_for(SETTINGS)
    out = []
    for a, pid in pages:
        probe = page_probe(a, pid, KEY)
        v = decide_batch([a], [pid], index.lookup([probe]), SETTINGS, url_keys=[KEY])[0]
        index.claim([Claim(probe, v.doc, v.decision, v.depends_on, v.replaces,
                           v.replaces_in_batch)])
        out.append(v.decision)
    return out


def brief(d: Decision) -> tuple[str, str, int | None]:
    return d.decision, d.reason, d.previous and d.previous.page_id


def gone(index: RedisIndex, *ids: int) -> None:
    """Replaced versions: state R, out of every key, their verification records deleted."""
    for q in ids:
        record = index.layout.record_key(q)
        at = record.index(b"}") + 5
        assert (index.client.hget(record[:at], record[at:]) or b"")[:1] == b"R"
        store = index.records if index.records is not None else index.client
        assert store.get(index.layout.doc_key(q)) is None
    for a, q in ((FIRST, V0), (SECOND, OLD), (THIRD, OLD)):
        if q in ids:  # a copy of its bytes under another URL is not dropped against it
            answer = index.lookup([Probe(-1, a.raw_fp, None, None)], register=False)[0]
            assert answer.raw not in ids


@pytest.mark.parametrize("young_page", ["changed", "unchanged"])
def test_a_younger_fetch_that_read_first_is_flagged_and_replaces_the_older(
        two, young_page: str) -> None:  # type: ignore[no-untyped-def]
    """young reads (sees V0), then old reads and flags it: old replaces V0; young, decided
    on V0 (changed: a keep; unchanged, the same bytes as V0: a drop), must not hold, or
    V0's replacement and young's would both be held, or old kept over a younger fetch."""
    a, b = two
    young_a = THIRD if young_page == "changed" else FIRST
    young_answer = ask(b, young_a, YOUNG, KEY)
    assert young_answer.version == V0
    old = finish(a, SECOND, OLD, KEY)
    assert brief(old.decision) == ("keep", "changed", V0)
    stale = decide(young_a, YOUNG, young_answer, KEY)
    assert not claim(b, young_a, YOUNG, stale, KEY), "the flag must stop this claim"
    young = finish(b, young_a, YOUNG, KEY)
    assert held(a) == [(YOUNG, "K")]
    gone(a, V0, OLD)
    want = serial([(FIRST, V0), (SECOND, OLD), (young_a, YOUNG)])[1:]
    assert [brief(old.decision), brief(young.decision)] == [brief(d) for d in want]
    assert brief(young.decision) == ("keep", "changed", OLD)


@pytest.mark.parametrize("old_page", ["changed", "unchanged"])
def test_a_younger_fetch_that_sees_the_older_pending_waits_and_replaces_it(
        two, old_page: str) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    old_a = SECOND if old_page == "changed" else FIRST
    old_answer = ask(a, old_a, OLD, KEY)
    assert ask(b, THIRD, YOUNG, KEY).prior == WAIT
    old = decide(old_a, OLD, old_answer, KEY)
    assert claim(a, old_a, OLD, old, KEY)
    young = finish(b, THIRD, YOUNG, KEY)
    assert held(b) == [(YOUNG, "K")]
    gone(b, *((V0, OLD) if old_page == "changed" else (V0,)))
    want = serial([(FIRST, V0), (old_a, OLD), (THIRD, YOUNG)])[1:]
    assert [brief(old.decision), brief(young.decision)] == [brief(d) for d in want]


def test_two_fetches_in_one_batch_leave_the_later(two) -> None:  # type: ignore[no-untyped-def]
    """Both kept in one claim call: the later replaces the earlier (replaces_claim), which
    replaced V0; only once the earlier is KEEP."""
    a, _ = two
    pages = [(SECOND, OLD), (THIRD, YOUNG)]
    probes = [page_probe(x, pid, KEY) for x, pid in pages]
    verdicts = decide_batch([x for x, _ in pages], [pid for _, pid in pages], a.lookup(probes),
                            SETTINGS, url_keys=[KEY, KEY])
    assert a.claim([Claim(p, v.doc, v.decision, v.depends_on, v.replaces, v.replaces_in_batch)
                    for p, v in zip(probes, verdicts, strict=True)]) == [True, True]
    assert held(a) == [(YOUNG, "K")]
    gone(a, V0, OLD)
    want = serial([(FIRST, V0), *pages])[1:]
    assert [brief(v.decision) for v in verdicts] == [brief(d) for d in want]


def test_a_replaced_version_delivered_again_gets_its_keep_back(two) -> None:  # type: ignore[no-untyped-def]
    """R is final: V0 delivered again gets its first decision (a keep) and holds nothing;
    the new version delivered again retires V0 again (idempotent) and changes nothing."""
    a, b = two
    new = finish(a, SECOND, OLD, KEY)
    again = ask(b, FIRST, V0, KEY).prior
    assert (again.decision, again.reason) == ("keep", "unique")
    assert brief(ask(b, SECOND, OLD, KEY).prior) == brief(new.decision)
    assert held(a) == [(OLD, "K")]
    gone(a, V0)
    assert len(a) == 1


def test_an_instance_that_cached_the_replaced_version_does_not_use_it(two) -> None:  # type: ignore[no-untyped-def]
    """b cached V0's KEEP and record (it decided a copy against it); a replaces V0; then b
    decides another copy of V0's bytes: kept (V0 holds nothing now), and a fetch of the URL
    is compared with the new version."""
    a, b = two
    copy = analysis("http://other.example/", text(1))
    dropped = finish(b, copy, position_id(950, 1, 1))
    assert (dropped.decision.decision, dropped.decision.duplicate_of.page_id) == ("drop", V0)
    assert b._final.get(int.from_bytes(b._refs[V0], "big")) == ("K", V0) and V0 in b._records
    finish(a, SECOND, OLD, KEY)
    again = finish(b, analysis("http://third.example/", text(1)), position_id(1_100, 1, 2))
    assert (again.decision.decision, again.decision.reason) == ("keep", "unique")
    recrawl = finish(b, analysis(URL, text(4)), position_id(1_200, 1, 3), KEY)
    assert brief(recrawl.decision) == ("keep", "changed", OLD)
    assert held(b) == [(position_id(1_200, 1, 3), "K")]
