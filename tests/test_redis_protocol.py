"""The shared-index protocol, one interleaving at a time, against a real Redis Cluster.

Two instances (two RedisIndex clients) decide two near-duplicates: `old` (the smaller page
id) and `young`. Each test fixes an order of their steps (lookup = register + read + peek,
then the pure decide step, then claim) that breaks a weaker protocol; tests/test_race.py
then runs thousands of groups at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from indexkit import flush_redis

from stream_dedup import Settings
from stream_dedup.decide.step import Verdict, decide_batch
from stream_dedup.decide.verdicts import Analysis
from stream_dedup.errors import IndexUnavailable
from stream_dedup.index import RAW, contain_options
from stream_dedup.index.base import WAIT, Answer, Claim
from stream_dedup.index.redis.backend import RedisIndex
from stream_dedup.index.redis.layout import REF_BYTES, SHARDS, id_bytes, set_members
from stream_dedup.index.redis.lease import Leases
from stream_dedup.models import Page, position_id
from stream_dedup.pipeline.deduplicator import Analyzer
from stream_dedup.pipeline.rounds import page_probe

SETTINGS = Settings()
OLD, YOUNG = position_id(1_000, 0, 5), position_id(1_001, 1, 9)
TEXT = " ".join(f"word{i % 97}x{i}" for i in range(300))


def analysis(url: str, text: str) -> Analysis:
    return Analyzer(SETTINGS).analyze(Page(url, f"<p>{text}</p>".encode(),
                                           (("Content-Type", "text/html"),)))


@pytest.fixture(params=["records in the index", "records in a store"])
def two(redis_url: str, request: pytest.FixtureRequest
        ) -> Iterator[tuple[RedisIndex, RedisIndex]]:
    """Two instances on one index; the verification records in its Redis, or in another
    (--redis-records-url: a single Redis here)."""
    a, b = open_two(redis_url, request)
    yield a, b
    a.close()
    b.close()


def open_two(redis_url: str, request: pytest.FixtureRequest) -> tuple[RedisIndex, RedisIndex]:
    """Two instances on one emptied index, the records where `request.param` says."""
    flush_redis(redis_url)
    store = ""
    if request.param == "records in a store":
        store = request.getfixturevalue("redis_single_url")
        flush_redis(store)
    a, b = (RedisIndex(redis_url, SETTINGS.params.stamp, records_url=store,
                                 **contain_options(SETTINGS)) for _ in range(2))
    return a, b


OLD_PAGE = analysis("http://x/old", TEXT)
YOUNG_PAGE = analysis("http://x/young", TEXT.replace("word5x5", "other"))


def ask(index: RedisIndex, a: Analysis, pid: int, url_key: int = 0) -> Answer:
    return index.lookup([page_probe(a, pid, url_key)])[0]


def decide(a: Analysis, pid: int, answer: Answer, url_key: int = 0) -> Verdict:
    return decide_batch([a], [pid], [answer], SETTINGS, url_keys=[url_key])[0]


def claim(index: RedisIndex, a: Analysis, pid: int, v: Verdict, url_key: int = 0) -> bool:
    return index.claim([Claim(page_probe(a, pid, url_key), v.doc, v.decision, v.depends_on,
                              v.replaces, v.replaces_in_batch)])[0]


def finish(index: RedisIndex, a: Analysis, pid: int, url_key: int = 0) -> Verdict:
    """Ask, decide and claim until a claim holds (what the deduplicator's loop does)."""
    for _ in range(20):
        answer = ask(index, a, pid, url_key)
        assert answer.prior != WAIT
        if answer.prior is not None:
            return Verdict(answer.prior)
        v = decide(a, pid, answer, url_key)
        if claim(index, a, pid, v, url_key):
            return v
    raise AssertionError("no claim held in 20 rounds")


def test_a_younger_page_that_read_first_is_flagged_and_decides_again(two) -> None:  # type: ignore[no-untyped-def]
    """young reads before old registers (sees nothing); old reads and sees young pending:
    old goes on as if young were not there, so young must not be kept unread again."""
    a, b = two
    young_answer = ask(b, YOUNG_PAGE, YOUNG)
    old = finish(a, OLD_PAGE, OLD)
    assert old.decision.decision == "keep"
    young = decide(YOUNG_PAGE, YOUNG, young_answer)
    assert young.decision.decision == "keep"  # on what it read: nothing
    assert not claim(b, YOUNG_PAGE, YOUNG, young), "the flag must stop this keep"
    again = finish(b, YOUNG_PAGE, YOUNG)
    assert (again.decision.decision, again.decision.duplicate_of.page_id) == ("drop", OLD)
    if b.records is not None:  # young's record, written for the lost keep, went with the drop
        assert b.records.get(b.layout.doc_key(YOUNG)) is None
        assert b.records.get(b.layout.doc_key(OLD)) is not None
    assert not a._unkept and not b._unkept  # nothing left to clean up


def test_a_page_that_sees_an_older_one_pending_waits_for_it(two) -> None:  # type: ignore[no-untyped-def]
    """old reads first (sees nothing); young reads while old is pending: young waits, and
    is decided against old once old is kept."""
    a, b = two
    old_answer = ask(a, OLD_PAGE, OLD)
    assert ask(b, YOUNG_PAGE, YOUNG).prior == WAIT
    old = decide(OLD_PAGE, OLD, old_answer)
    assert claim(a, OLD_PAGE, OLD, old) and old.decision.decision == "keep"
    young = finish(b, YOUNG_PAGE, YOUNG)
    assert (young.decision.decision, young.decision.duplicate_of.page_id) == ("drop", OLD)


def test_a_page_delivered_again_gets_its_decision_back(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    first = finish(a, OLD_PAGE, OLD)
    finish(b, YOUNG_PAGE, YOUNG)
    again = ask(b, OLD_PAGE, OLD)  # another instance, after a rebalance
    assert again.prior is not None and again.prior.page_id == first.decision.page_id
    assert again.prior.decision == "keep"
    dropped = ask(a, YOUNG_PAGE, YOUNG).prior
    assert (dropped.decision, dropped.duplicate_of.page_id) == ("drop", OLD)


def test_a_decision_longer_than_a_compact_record_is_kept_beside_it(two) -> None:  # type: ignore[no-untyped-def]
    """On a Redis with the default hash-max-listpack-value (64), a drop's decision (it
    names a page and its URL) would turn its record bucket into a hash table: it goes to a
    key of its own, and a re-delivery still gets it back."""
    a, b = two
    a.listpack_value = b.listpack_value = 64
    finish(a, OLD_PAGE, OLD)
    young = finish(b, YOUNG_PAGE, YOUNG)
    assert young.decision.decision == "drop"
    record = a.layout.record_key(YOUNG)
    at = record.index(b"}") + 5
    value = a.client.hget(record[:at], record[at:])
    assert value[:1] == b"D" and value[5 + REF_BYTES :] == b">" and len(value) <= 64
    assert len(a.client.get(b"{%d}V" % (YOUNG % SHARDS) + id_bytes(YOUNG))) > 64
    record = a.layout.record_key(OLD)
    kept = a.client.hget(_bucket(record), record[len(_bucket(record)) :])
    assert kept[:1] == b"K" and kept[5 + REF_BYTES :] == b"u"  # a plain keep: in its record
    again = ask(a, YOUNG_PAGE, YOUNG).prior  # delivered again
    assert (again.decision, again.reason, again.duplicate_of, again.resemblance) == (
        "drop", young.decision.reason, young.decision.duplicate_of,
        young.decision.resemblance)


def test_sets_name_pages_by_ref_and_refs_by_page(two) -> None:  # type: ignore[no-untyped-def]
    """A page's entries hold its ref (6 bytes), given when its record is first registered
    and the same when it registers again; its ref entry gives its id back."""
    a, b = two
    ask(a, OLD_PAGE, OLD)
    ref = a._refs[OLD]
    ask(b, OLD_PAGE, OLD)  # registered again (another instance): the same ref
    assert b._refs[OLD] == ref and len(ref) == REF_BYTES
    assert int.from_bytes(ref, "big") % SHARDS == OLD % SHARDS  # in the page's hash tag
    assert page_of(a, int.from_bytes(ref, "big")) == OLD
    key = a.layout.set_key(b"r", OLD_PAGE.raw_fp)
    assert set(set_members(a.client.get(_bucket(key)), key)) == {int.from_bytes(ref, "big")}
    ask(a, YOUNG_PAGE, YOUNG)
    assert a._refs[YOUNG] != ref


def test_a_pending_page_whose_instance_died_stops_blocking_when_its_lease_ends(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    a.leases.lease_ms = 300
    ask(a, OLD_PAGE, OLD)  # registered, then its instance is gone: its leases not renewed
    a.leases.close(release=False)
    assert ask(b, YOUNG_PAGE, YOUNG).prior == WAIT
    time.sleep(0.4)
    young = finish(b, YOUNG_PAGE, YOUNG)
    assert young.decision.decision == "keep"
    # The old page delivered again (to any instance) is decided against the kept one.
    a.leases = Leases(a.url, a.layout.record_key)
    old = finish(a, OLD_PAGE, OLD)
    assert (old.decision.decision, old.decision.duplicate_of.page_id) == ("drop", YOUNG)


def test_a_live_instance_keeps_its_pending_pages_however_long_it_takes(  # type: ignore[no-untyped-def]
        two, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its leases are renewed while it decides: a page waits for the older one all along
    (no time limit, nothing stolen), and the older one's claim holds."""
    from stream_dedup.index.redis import lease as redis_lease

    monkeypatch.setattr(redis_lease, "RENEW_EVERY_S", 0.1)
    a, b = two
    a.leases.close()
    a.leases = redis_lease.Leases(a.url, a.layout.record_key)
    a.leases.lease_ms = 400
    old_answer = ask(a, OLD_PAGE, OLD)
    for _ in range(8):  # 1.6 s: four leases long
        time.sleep(0.2)
        assert ask(b, YOUNG_PAGE, YOUNG).prior == WAIT
        a.leases.hold([])  # a's deciding loop makes progress
    old = decide(OLD_PAGE, OLD, old_answer)
    assert claim(a, OLD_PAGE, OLD, old) and old.decision.decision == "keep"
    young = finish(b, YOUNG_PAGE, YOUNG)
    assert (young.decision.decision, young.decision.duplicate_of.page_id) == ("drop", OLD)


def test_a_page_given_up_is_released_at_once(two) -> None:  # type: ignore[no-untyped-def]
    """An instance that gives a page up (a batch abandoned, a stop, the index closed)
    releases it: nobody waits for it, and its own late claim cannot hold."""
    a, b = two
    old_answer = ask(a, OLD_PAGE, OLD)
    assert ask(b, YOUNG_PAGE, YOUNG).prior == WAIT
    a.release([OLD])
    young = finish(b, YOUNG_PAGE, YOUNG)
    assert young.decision.decision == "keep"
    stale = decide(OLD_PAGE, OLD, old_answer)  # decided on what it read before: nothing
    assert stale.decision.decision == "keep"
    assert not claim(a, OLD_PAGE, OLD, stale), "a released page's claim must not hold"
    old = finish(a, OLD_PAGE, OLD)
    assert (old.decision.decision, old.decision.duplicate_of.page_id) == ("drop", YOUNG)
    assert a.leases.held() == []  # final: nothing left to renew


def test_an_index_closed_releases_the_pages_it_holds(redis_url: str) -> None:
    flush_redis(redis_url)
    a, b = (RedisIndex(redis_url, SETTINGS.params.stamp, **contain_options(SETTINGS))
            for _ in range(2))
    ask(a, OLD_PAGE, OLD)
    assert ask(b, YOUNG_PAGE, YOUNG).prior == WAIT
    a.close()  # a stop: nobody waits for what it was deciding
    young = finish(b, YOUNG_PAGE, YOUNG)
    assert young.decision.decision == "keep"
    b.close()


def test_a_lease_that_ran_out_is_not_renewed(two) -> None:  # type: ignore[no-untyped-def]
    """A paused instance wakes after its lease ran out: renewing must not revive it (the
    others went on without the page), its claim fails, and it decides the page again."""
    a, b = two
    a.leases.lease_ms = 300
    old_answer = ask(a, OLD_PAGE, OLD)
    time.sleep(0.4)  # paused: no renewal
    young = finish(b, YOUNG_PAGE, YOUNG)  # b reads old as gone
    assert young.decision.decision == "keep"
    a.leases.lease_ms = 60_000
    assert a.leases.renew() == 0
    stale = decide(OLD_PAGE, OLD, old_answer)
    assert not claim(a, OLD_PAGE, OLD, stale)
    old = finish(a, OLD_PAGE, OLD)
    assert (old.decision.decision, old.decision.duplicate_of.page_id) == ("drop", YOUNG)


def test_a_stop_ends_a_wait(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    ask(a, OLD_PAGE, OLD)
    b.interrupt()
    with pytest.raises(IndexUnavailable, match="stopping"):
        b._wait({YOUNG})


def _bucket(key: bytes) -> bytes:
    return key[: key.index(b"}") + 5]


def page_of(index: RedisIndex, ref: int) -> int | None:
    """The page id a ref names (its ref entry; None: no page)."""
    key = index.layout.ref_key(ref)
    value = index.client.hget(_bucket(key), key[len(_bucket(key)) :])
    return None if value is None else int.from_bytes(value[:13], "big")


def _refs(client, key: bytes) -> dict[bytes, int]:  # type: ignore[no-untyped-def]
    """The refs in an entry's set with their expiries (a bucket with expiries)."""
    blob = client.get(_bucket(key))
    assert blob is None or blob[:1] == b"e"
    return {r.to_bytes(REF_BYTES, "big"): e for r, e in set_members(blob, key).items()}


def _entry(index: RedisIndex, key: bytes) -> tuple[bytes, dict[bytes, int]]:
    """An entry's bucket, and its members' ids with their expiries."""
    return _bucket(key), {id_bytes(page_of(index, int.from_bytes(r, "big")) or 0): e
                          for r, e in _refs(index.client, key).items()}


def _put(client, key: bytes, members: dict[bytes, int], due: int) -> None:  # type: ignore[no-untyped-def]
    """Make `key`'s bucket hold its set only: `members` with their expiries (in id order),
    swept next at `due`."""
    field = key[len(_bucket(key)) :]
    client.set(_bucket(key), b"e" + due.to_bytes(4, "big") + b"".join(
        field + q + e.to_bytes(4, "big") for q, e in sorted(members.items())))


def test_keys_expire_with_the_pages_crawl_time(redis_url: str) -> None:
    """--retention-days: a page's entries and record go `retention` after its crawl time
    (the time in its id; a page already older is held an hour); an entry past its time
    leaves when a new page joins its set, or when its bucket is swept; a bucket lives as
    long as its newest entry."""
    from indexkit import first_with, keep
    from test_index import _doc

    flush_redis(redis_url)
    index = RedisIndex(redis_url, 1, retention_days=1)
    layout, client = index.layout, index.client
    now_ms = int(time.time() * 1000)
    now = now_ms // 1000
    fresh, old = position_id(now_ms, 0, 1), position_id(now_ms - 3 * 86_400_000, 0, 2)
    # An entry of an earlier page, past its time, in the bucket feature 7 is in
    # (another field of it: only a sweep of the bucket can take it away).
    neighbour = layout.set_key(b"", 7 + SHARDS * layout.buckets)
    lapsed = (999 * SHARDS + 9).to_bytes(REF_BYTES, "big")  # (a page's ref: no page's)
    _put(client, neighbour, {lapsed: now - 10}, due=0)
    keep(index, _doc([7, 8], raw=1, canon=1), fresh)
    keep(index, _doc([7, 9], raw=2, canon=2), old)  # crawled 3 days ago: held for the hour
    bucket, ids = _entry(index, layout.set_key(b"r", 1))
    assert abs(ids[id_bytes(fresh)] - (now + 86_400)) <= 60
    assert 86_400 - 60 < client.ttl(bucket) <= 86_400
    bucket, ids = _entry(index, layout.set_key(b"r", 2))
    assert abs(ids[id_bytes(old)] - (now + 3_600)) <= 60
    assert 3_600 - 60 < client.ttl(bucket) <= 3_600
    record = layout.record_key(fresh)
    assert 86_400 - 60 < client.ttl(record[: record.index(b"}") + 5]) <= 86_400
    assert 86_400 - 60 < client.ttl(b"{%d}D" % (fresh % SHARDS) + id_bytes(fresh)) <= 86_400
    # The feature both share: both ids, each with its own time; the bucket as its newest.
    bucket, ids = _entry(index, layout.set_key(b"", 7))
    assert set(ids) == {id_bytes(fresh), id_bytes(old)}
    assert 86_400 - 60 < client.ttl(bucket) <= 86_400
    assert not set_members(client.get(_bucket(neighbour)), neighbour)  # swept
    # An id whose time has come leaves its set when a page joins it.
    seven = layout.set_key(b"", 7)
    _put(client, seven, {lapsed: now - 10, **_refs(client, seven)}, due=now + 3_600)
    keep(index, _doc([7, 10], raw=3, canon=3), position_id(now_ms + 1, 0, 3))
    assert lapsed not in _refs(client, seven)
    _, ids = _entry(index, seven)
    assert {id_bytes(old), id_bytes(fresh)} <= set(ids)
    index.close()

    short = RedisIndex(redis_url, 1, retention_days=2 / 86_400)  # a 2-second window
    keep(short, _doc([11], raw=11, canon=11), position_id(int(time.time() * 1000), 0, 4))
    assert first_with(short, RAW, 11) is not None
    time.sleep(3.0)
    assert first_with(short, RAW, 11) is None  # forgotten: a copy now would be kept
    short.close()


def test_an_index_is_opened_only_with_the_parameters_it_was_made_with(redis_url: str) -> None:
    """Sketch parameters and buckets are part of the index: another value of either would
    put entries where no instance looks for them."""
    from stream_dedup.errors import IndexMismatchError

    flush_redis(redis_url)
    RedisIndex(redis_url, 1, buckets=64).close()
    RedisIndex(redis_url, 1, buckets=64).close()  # the same: fine
    with pytest.raises(IndexMismatchError, match="--redis-buckets 64 .*give 128"):
        RedisIndex(redis_url, 1)
    with pytest.raises(IndexMismatchError, match="other sketch parameters"):
        RedisIndex(redis_url, 2, buckets=64)
    # An index laid out by an earlier version (format 5: ids in hashes) is refused, not
    # misread
    flush_redis(redis_url)
    old = RedisIndex(redis_url, 1)
    old.client.set(b"stream-dedup:stamp", b"1:1024:5:128")
    old.close()
    with pytest.raises(IndexMismatchError, match="another version .*format 5.* is 6"):
        RedisIndex(redis_url, 1)


def test_a_key_new_to_its_bucket_goes_at_its_end_once(redis_url: str) -> None:
    """Most joins are of keys new to their bucket: the entry goes at the bucket's end, the
    other keys' entries as they were; a page asking again before its claim (its batch
    retried) finds its own entries and adds none, in any of its keys."""
    import numpy as np

    from stream_dedup.index.base import Probe

    flush_redis(redis_url)
    index = RedisIndex(redis_url, 1)
    layout, client = index.layout, index.client
    other = layout.buckets * SHARDS + 7  # the bucket of feature 7, another field
    first = Probe(OLD, 11, 12, np.array([other], dtype=np.uint64), 13)
    index.lookup([first])
    key, neighbour = layout.set_key(b"", 7), layout.set_key(b"", other)
    before = client.get(_bucket(key))
    page = Probe(YOUNG, 21, 22, np.array([7, 8], dtype=np.uint64), 23)
    index.lookup([page])
    after = client.get(_bucket(key))
    assert after[: len(before)] == before and len(after) == len(before) + 3 + REF_BYTES
    ref = int.from_bytes(index._refs[YOUNG], "big")
    assert set_members(after, key) == {ref: 0}
    assert set_members(after, neighbour) == {int.from_bytes(index._refs[OLD], "big"): 0}
    keys = layout.probe_shards(page)[0]
    blobs = [client.get(_bucket(k)) for k in keys]
    assert index.lookup([page])[0].prior is None  # delivered again, still PENDING
    assert [client.get(_bucket(k)) for k in keys] == blobs
    assert all(set_members(b, k) == {ref: 0} for b, k in zip(blobs, keys, strict=True))
    index.close()
