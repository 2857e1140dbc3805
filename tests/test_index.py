"""One contract, every backend in SUPPORTED_INDEXES."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from indexkit import candidates, first_with, flush_redis, keep

from stream_dedup.index import CANONICAL, RAW, SUPPORTED_INDEXES, FeatureIndex, StoredDoc
from stream_dedup.index.base import Probe
from stream_dedup.index.memory import SortedRunMultimap
from stream_dedup.index.redis.backend import RedisIndex


def _doc(
    features: list[int], raw: int = 0, canon: int = 0, url: str = "u", text: int = 10
) -> StoredDoc:
    return StoredDoc(
        url=url,
        features=np.array(features, dtype=np.uint64),
        sketch=np.arange(84, dtype=np.uint32),
        ld_signature=b"sig",
        text_length=text,
        raw_fp=raw,
        canonical_fp=canon,
        shingles=_shingles(raw),
    )


def _shingles(raw: int) -> bytes:
    """A page's shingle set, its own length and values (the record must keep both)."""
    n = raw % 1000
    return np.arange(n, 3 * n + 40, dtype="<u4").tobytes()


@pytest.fixture(params=[*sorted(SUPPORTED_INDEXES), "redis", "redis-single"])
def make_index(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    opened: list[FeatureIndex] = []

    def make(cap: int = 64) -> FeatureIndex:
        if request.param.startswith("redis"):  # a 3-master Redis Cluster, or one Redis
            url = request.getfixturevalue(
                "redis_url" if request.param == "redis" else "redis_single_url")
            flush_redis(url)
            index: FeatureIndex = RedisIndex(url, 1234, cap)
        else:
            index = SUPPORTED_INDEXES[request.param](1234, cap, tmp_path / f"idx{len(opened)}")
        opened.append(index)
        return index

    yield make
    for index in opened:
        index.close()


def test_claimed_pages_and_their_records_round_trip(make_index) -> None:  # type: ignore[no-untyped-def]
    index: FeatureIndex = make_index()
    ids = [(1 << 90) + 7 * i for i in range(5)]  # input positions: large and sparse
    for i, pid in enumerate(ids):
        keep(index, _doc([i, i + 100], raw=i, canon=i, url=f"http://x/{i}"), pid)
    assert len(index) == 5
    assert candidates(index, [3, 103, 5], 2) == [(ids[3], 2)]
    answer = index.lookup([Probe(-1, 3, None, None)], register=False)[0]
    assert answer.raw is not None
    doc = answer.docs[answer.raw]  # what verification reads: url, sketch, signature, length
    assert (doc.url, doc.page_id, doc.ld_signature, doc.text_length) == (
        "http://x/3", ids[3], b"sig", 10)
    assert doc.sketch.tolist() == list(range(84))
    assert doc.shingles == _shingles(3)  # and the shingle set (exact verification)
    assert index.stamp == 1234


def test_exact_layers_return_the_earliest_page(make_index) -> None:  # type: ignore[no-untyped-def]
    index: FeatureIndex = make_index()
    keep(index, _doc([1], raw=10, canon=20), 0)
    keep(index, _doc([2], raw=11, canon=20), 1)
    assert first_with(index, RAW, 10) == 0
    assert first_with(index, RAW, 11) == 1
    assert first_with(index, CANONICAL, 20) == 0
    assert first_with(index, RAW, 99) is None
    keep(index, _doc([3], raw=12, canon=21, text=0), 2)  # no text: no canonical entry
    assert first_with(index, CANONICAL, 21) is None


def test_candidates_count_shared_features(make_index) -> None:  # type: ignore[no-untyped-def]
    index: FeatureIndex = make_index()
    keep(index, _doc([1, 2, 3, 4, 5, 6]), 0)
    keep(index, _doc([1, 2, 30, 40, 50, 60]), 1)
    keep(index, _doc([1, 20, 30, 40, 50, 60]), 2)
    query = [1, 2, 3, 40, 77, 88]
    assert candidates(index, query, 2) == [(0, 3), (1, 3), (2, 2)]
    assert candidates(index, query, 3) == [(0, 3), (1, 3)]
    assert candidates(index, [9, 99], 1) == []


def test_posting_lists_are_capped_to_the_most_recent(make_index) -> None:  # type: ignore[no-untyped-def]
    index: FeatureIndex = make_index(cap=4)
    n = 1_500 if isinstance(index, RedisIndex) else 20_000  # memory: flushes and merges
    for i in range(n):
        keep(index, _doc([7, 1_000_000 + i], raw=i, canon=i), i)
        if i % 3_000 == 2_999:
            index.commit()
    found = candidates(index, [7], 1)
    ids = sorted(pid for pid, _ in found)
    assert len(ids) <= 4  # a feature's `cap` most recent pages
    assert ids[-1] == n - 1
    assert first_with(index, RAW, 5) == 5
    assert candidates(index, [1_000_000 + 1_234, 7], 1)[0] == (1_234, 1)


@pytest.mark.slow
def test_random_workload_matches_a_plain_dict_model(make_index) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(5)
    index: FeatureIndex = make_index(cap=1_000_000)
    model: dict[int, list[int]] = {}
    for pid in range(3_000 if isinstance(index, RedisIndex) else 30_000):
        feats = rng.sample(range(5_000), 3)
        keep(index, _doc(feats, raw=pid, canon=pid), pid)
        if pid % 1_000 == 999:
            index.commit({"t/0": pid + 1})
        for f in feats:
            model.setdefault(f, []).append(pid)
        if pid % 2_999 == 0:
            q = rng.sample(range(5_000), 3)
            counts: dict[int, int] = {}
            for f in q:
                for p in model.get(f, []):
                    counts[p] = counts.get(p, 0) + 1
            expected = sorted(
                ((p, c) for p, c in counts.items() if c >= 1), key=lambda t: (-t[1], t[0])
            )
            assert candidates(index, q, 1) == expected


def test_multimap_keep_first_and_last() -> None:
    first = SortedRunMultimap(cap=1, keep="first")
    last = SortedRunMultimap(cap=2, keep="last")
    for v in range(50_000):
        first.add(v % 100, v)
        last.add(v % 100, v)
    first.flush()
    last.flush()
    assert first.values(42) == [42]
    got = sorted(last.get_many(np.array([42], dtype=np.uint64)))
    assert got[-2:] == [49_842, 49_942] and len(got) <= 4


@pytest.mark.parametrize("keep, cap", [("last", 3), ("first", 2), ("last", 1), ("first", 1)])
def test_multimap_kernels_match_python(
    keep: str, cap: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled memtable and run lookups (all keys' values, and each key's) store and
    find what the Python code does, across flushes and merges, with 64-bit keys sharing
    their low 32 bits."""
    from stream_dedup.index import memory

    if memory._native is None:
        pytest.skip("compiled kernels not built")
    monkeypatch.setattr(memory, "_MEMTABLE_MAX", 400)  # many flushes and merges
    rng = random.Random(5)
    keys = [rng.randrange(1 << 64) for _ in range(2_000)] + [7, 7 | (1 << 40)]
    ops = [[rng.choice(keys) for _ in range(rng.randint(1, 6))] for _ in range(6_000)]
    queries = [np.array(rng.sample(keys, 6), dtype=np.uint64) for _ in range(50)]

    def run() -> tuple[list[list[int]], list[tuple[list[int], list[int]]]]:
        m = SortedRunMultimap(cap=cap, keep=keep)
        got = []
        for value, page_keys in enumerate(ops):
            m.add_many(np.array(page_keys, dtype=np.uint64), value)
            if value % 1_500 == 0:
                got += [sorted(m.get_many(q)) for q in queries]
                got += [sorted(p) for q in queries for p in m.postings(q)]
        return got, [(k.tolist(), v.tolist()) for k, v in m._runs]

    compiled = run()
    monkeypatch.setattr(memory, "_native", None)
    assert run() == compiled
    assert compiled[1], "the check must cover flushed (and merged) runs"


def test_commit_stores_offsets(make_index) -> None:  # type: ignore[no-untyped-def]
    index: FeatureIndex = make_index()
    if isinstance(index, RedisIndex):
        pytest.skip("a shared index keeps no offsets: the consumer group's commits do")
    assert index.offsets() == {}
    keep(index, _doc([1, 2]), 0)
    index.commit({"pages/0": 10, "pages/1": 3})
    index.commit({"pages/0": 12})
    assert index.offsets() == {"pages/0": 12, "pages/1": 3}
    assert first_with(index, RAW, 0) == 0 and len(index) == 1


def test_exact_layers_confirm_the_full_fingerprint(make_index) -> None:  # type: ignore[no-untyped-def]
    """Fingerprints equal in their low 32 bits are still told apart (no false exact drop)."""
    index: FeatureIndex = make_index()
    a, b = 0x1234_5678_0000_0042, 0x8765_4321_0000_0042
    keep(index, _doc([1], raw=a, canon=a), 0)
    index.commit()
    assert first_with(index, RAW, a) == 0
    assert first_with(index, RAW, b) is None
    keep(index, _doc([2], raw=b, canon=b), 1)
    assert first_with(index, RAW, b) == 1 and first_with(index, CANONICAL, b) == 1
