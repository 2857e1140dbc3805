"""The memory index's deep containment keys on disk (index/deep.py): what a key holds
after spills and merges from file to file, against a plain model; the keys themselves
(core/contain.py deep_keys, deep_asked)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from stream_dedup.core import contain
from stream_dedup.index import deep


def _store(tmp_path, cap: int, dead=lambda rows: None) -> deep.DeepKeys:  # type: ignore[no-untyped-def]
    return deep.DeepKeys(str(tmp_path), cap, dead)


@pytest.mark.parametrize(("seed", "kernel"), [(s, k) for s in range(4) for k in (True, False)])
def test_each_key_holds_its_cap_most_recent_rows(tmp_path, monkeypatch, seed: int,  # type: ignore[no-untyped-def]
                                                 kernel: bool) -> None:
    """Small tables, steps and blocks: many runs, merges of many steps, keys across blocks;
    the kernels and their Python twins alike."""
    rng = np.random.default_rng(seed)
    if not kernel:
        monkeypatch.setattr(deep, "_native", None)
    monkeypatch.setattr(deep, "SLOTS", 1 << int(rng.integers(7, 10)))
    monkeypatch.setattr(deep, "_FIRST_SLOTS", 32)  # grown, then written out
    monkeypatch.setattr(deep, "STEP", int(rng.integers(1, 120)))  # (at least cap + 1)
    monkeypatch.setattr(deep, "BLOCK", int(rng.integers(2, 40)))
    cap = int(rng.integers(1, 9))
    store = _store(tmp_path, cap)
    model: dict[int, list[int]] = {}
    universe = rng.integers(0, 2**32, 300, dtype=np.uint64)  # few keys: long postings
    for row in range(2000 if kernel else 600):
        keys = np.unique(rng.choice(universe, int(rng.integers(0, 12))))
        store.add(keys | contain.DEEP_TAG, row)
        for k in keys.tolist():
            model.setdefault(k, []).append(row)
        if row % 97 == 0:
            asked = np.concatenate((rng.choice(universe, 20),
                                    rng.integers(0, 2**32, 5, dtype=np.uint64)))
            got = store.postings(asked | contain.DEEP_TAG)
            assert got == [model.get(k, [])[-cap:] for k in asked.tolist()]
    assert store.runs and len(store) > store._held  # on disk
    assert sum(1 for p in tmp_path.iterdir()) == 0  # unlinked from the start
    store.close()


def test_spills_and_merges_drop_the_rows_that_are_gone(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(deep, "SLOTS", 256)
    gone = set(range(0, 1000, 3))

    def dead(rows: np.ndarray) -> np.ndarray | None:
        mask = np.isin(rows, list(gone))
        return mask if mask.any() else None

    store = _store(tmp_path, 64, dead)
    for row in range(1000):
        store.add(np.array([row % 7, 1000 + row], np.uint64), row)
    store.spill()
    held = store.postings(np.arange(7, dtype=np.uint64))
    assert all(r not in gone for rows in held for r in rows)
    assert [len(rows) for rows in held] == [64] * 7  # the 64 most recent live ones
    assert held[0] == [r for r in range(1000) if r % 7 == 0 and r not in gone][-64:]
    on_disk = np.concatenate([run.read(0, run.n) & np.uint64(0xFFFFFFFF) for run in store.runs])
    assert on_disk.shape[0] == len(store) and not set(on_disk.tolist()) & gone


def test_deep_keys_are_the_sample_past_the_stored_keys() -> None:
    rng = np.random.default_rng(5)
    values = rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32)
    tops = np.uint32(0).astype("<u4").tobytes() + values.astype("<u4").tobytes()
    got = contain.deep_keys(tops, 4, 8)
    order = np.unique(contain.contain_order(values))
    want = order[4:][order[4:] < 2**29][: contain.CONTAIN_MAX - 4]
    assert (got & np.uint64(0xFFFFFFFF)).tolist() == want.tolist()
    assert np.all(got >> np.uint64(32) == contain.DEEP_TAG >> np.uint64(32))
    assert contain.deep_keys(tops, 4, 0).shape[0] == 0
    asked = contain.contain_keys(tops[:12], 8)  # two shingles: the rest are fill keys
    deep_asked = contain.contain_keys(tops[:12], 8, 3)[-3:]
    assert (deep_asked[:2] & np.uint64(0xFFFFFFFF)).tolist() == \
        (asked[:2] & np.uint64(0xFFFFFFFF)).tolist()
    assert deep_asked[2] >> np.uint64(32) not in (contain.DEEP_TAG >> np.uint64(32),
                                                  contain.CONTAIN_TAG >> np.uint64(32))


def test_the_sample_without_the_kernel_is_the_same(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(6)
    for n in (0, 3, 40, 900, 4000):
        values = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
        tops = np.uint32(0).astype("<u4").tobytes() + values.astype("<u4").tobytes()
        want = contain.deep_keys(tops, 4, 8).tolist()
        with monkeypatch.context() as m:
            m.setattr(contain, "_native", None)
            assert contain.deep_keys(tops, 4, 8).tolist() == want, n


def test_a_full_disk_loses_nothing(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A run that cannot be written: IndexStoreError, and every entry still found."""
    from stream_dedup.errors import IndexStoreError

    monkeypatch.setattr(deep, "SLOTS", 64)
    monkeypatch.setattr(deep, "_FIRST_SLOTS", 64)
    store = _store(tmp_path, 8)
    real = os.pwrite
    for row in range(12):
        store.add(np.array([row % 3, 100 + row], np.uint64), row)
    monkeypatch.setattr(os, "pwrite", lambda *a: (_ for _ in ()).throw(OSError(28, "full")))
    with pytest.raises(IndexStoreError, match="deep containment keys"):
        for row in range(12, 40):
            store.add(np.array([row % 3, 100 + row], np.uint64), row)
    monkeypatch.setattr(os, "pwrite", real)
    added = row  # the page that found the disk full was not added
    got = store.postings(np.array([0, 1, 2, 105], np.uint64))
    assert got[:3] == [[r for r in range(added) if r % 3 == k][-8:] for k in range(3)]
    assert got[3] == [5]
    store.spill()
    assert store.postings(np.array([0, 1, 2, 105], np.uint64)) == got


@pytest.mark.parametrize("kernel", [True, False])
def test_a_spill_is_written_out_while_pages_are_stored_and_asked(tmp_path, monkeypatch,  # type: ignore[no-untyped-def]
                                                                 kernel: bool) -> None:
    """The writer held at its first write: stores go on into a new table, and a lookup
    finds the rows of the runs, of the table being written out and of the new one, in
    order; the runs it made are swapped in at a store after it is done."""
    import threading

    if not kernel:
        monkeypatch.setattr(deep, "_native", None)
    monkeypatch.setattr(deep, "SLOTS", 64)
    monkeypatch.setattr(deep, "_FIRST_SLOTS", 64)
    store = _store(tmp_path, 8)
    release, writing = threading.Event(), threading.Event()
    real = os.pwrite

    def held_write(*args):  # type: ignore[no-untyped-def]
        writing.set()
        assert release.wait(30)
        return real(*args)

    for row in range(16):  # 32 entries: the table half full
        store.add(np.array([row % 3, 100 + row], np.uint64), row)
    store.spill()  # one run on disk
    for row in range(16, 32):
        store.add(np.array([row % 3, 100 + row], np.uint64), row)
    monkeypatch.setattr(os, "pwrite", held_write)
    store.add(np.array([32 % 3, 132], np.uint64), 32)  # the table is written out...
    assert writing.wait(30)
    for row in range(33, 40):  # ...while pages are stored
        store.add(np.array([row % 3, 100 + row], np.uint64), row)
    assert store._frozen is not None and len(store.runs) == 1
    want = [[r for r in range(40) if r % 3 == k][-8:] for k in range(3)] + [[5], [20], [36]]
    asked = np.array([0, 1, 2, 105, 120, 136], np.uint64)
    assert store.postings(asked) == want
    release.set()
    store.settle()
    assert store._frozen is None and store.postings(asked) == want
    store.close()
