"""The memory index's run merge a step at a time (index/runs.py) against the plain one."""

from __future__ import annotations

import numpy as np
import pytest

from stream_dedup.index import runs
from stream_dedup.index.memory import SortedRunMultimap


def _run(rng: np.random.Generator, n: int, keys: int, mapped: bool = False) -> runs.Run:
    k = np.sort(rng.integers(0, keys, n).astype(np.uint32), kind="stable")
    v = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    if not mapped:
        return k, v
    mk, mv = runs.mapped(n), runs.mapped(n)
    mk[:], mv[:] = k, v
    return mk, mv


def _copy(run: runs.Run) -> runs.Run:
    return run[0].copy(), run[1].copy()


@pytest.mark.parametrize("keep", ["first", "last"])
def test_merge_equals_the_plain_merge_on_random_runs(keep: str) -> None:
    rng = np.random.default_rng(29)
    for trial in range(200):
        older = _run(rng, int(rng.integers(0, 2000)), int(rng.integers(1, 3000)))
        newer = _run(rng, int(rng.integers(0, 2000)), int(rng.integers(1, 3000)))
        cap = int(rng.integers(1, 70))
        dead = (lambda v: (v % 5 == 0) if (v % 5 == 0).any() else None) if trial % 3 else None
        want = runs.merge_plain(older, newer, cap, keep, dead)
        got = runs.merge(_copy(older), _copy(newer), cap, keep, dead,
                         step=int(rng.integers(1, 500)))
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1]), trial
        assert got[0].dtype == got[1].dtype == np.uint32


def test_mapped_runs_merge_alike_and_give_their_pages_back() -> None:
    rng = np.random.default_rng(3)
    n = 4 * runs.MAPPED_MIN
    older, newer = _run(rng, n, 50_000, mapped=True), _run(rng, n // 3, 50_000, mapped=True)
    want = runs.merge_plain(older, newer, 2, "last")
    got = runs.merge(older, newer, 2, "last", step=10_000)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert runs._mapping(got[0]) is not None  # the result has a mapping of its own
    # the inputs were read and given back: their pages read as zeros now
    assert not older[0][: n - 1024].any() and not newer[1][: n // 3 - 1024].any()


def test_a_multimap_answers_as_before_through_many_merges() -> None:
    """Enough pages for runs past MAPPED_MIN, merged in steps: every key's values are the
    ones a plain dict of capped lists holds."""
    rng = np.random.default_rng(11)
    table = SortedRunMultimap(cap=3, keep="last")
    plain: dict[int, list[int]] = {}
    for value in range(60_000):
        keys = rng.integers(0, 40_000, 4, dtype=np.uint64)
        table.add_many(keys, value)
        for key in set(keys.tolist()):
            plain[key] = (plain.get(key, []) + [value])[-3:]
    assert any(k.shape[0] >= runs.MAPPED_MIN for k, _ in table._runs)
    probe = np.array(list(plain)[:5000], np.uint64)
    got = table.postings(probe)
    assert [sorted(g) for g in got] == [plain[k] for k in probe.tolist()]
