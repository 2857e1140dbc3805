"""Merging two sorted runs of the memory index without a second copy of them (issue 29).

A run is two uint32 arrays, keys ascending and the values of a key in insertion order.
Merging the largest runs used to concatenate them, argsort the concatenation and take the
sorted copy, then group and cap it: ~60 bytes of temporaries for each 8-byte entry at the
moment of the largest merge, which set the process's peak (944 bytes a page held through
`replay`, against ~200 at steady state).

Here a large run lives in its own anonymous memory mapping (`mapped`), and a merge writes
its output a step at a time into a new mapping while it gives the pages of both inputs it
has read back to the kernel (madvise MADV_DONTNEED), so the resident entries stay about the
inputs' total, plus a step's temporaries. A second pass caps each key's entries in place
(`cap` most recent, or first), reading ahead of where it writes. The result is the same as
the plain merge (`merge_plain`, the reference the tests hold it to): the inputs' entries
minus the dead ones, stably ordered by key (the older run's first), each key capped.

The inputs are consumed: after a merge their arrays must not be read again.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np

Run = tuple[np.ndarray, np.ndarray]
Dead = Callable[[np.ndarray], "np.ndarray | None"]

# Entries a merge step takes from each input (4 MiB of uint32 per array at most); runs of at
# least MAPPED_MIN entries get mappings of their own (smaller ones are plain arrays: their
# copies are small, and a mapping is a system call and at least a page).
STEP = 1 << 18
MAPPED_MIN = 1 << 16
_PAGE = mmap.PAGESIZE
_ADVISE = getattr(mmap, "MADV_DONTNEED", None)  # None off Linux: plain arrays


def mapped(n: int) -> np.ndarray:
    """An uninitialized uint32 array of n entries: its own anonymous mapping from MAPPED_MIN
    entries on (its pages resident only once written), else a plain array."""
    if n < MAPPED_MIN or _ADVISE is None:
        return np.empty(n, np.uint32)
    # private: a shared anonymous mapping would keep what MADV_DONTNEED gives back
    return np.frombuffer(mmap.mmap(-1, n * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS),
                         np.uint32, n)


def _mapping(arr: np.ndarray) -> mmap.mmap | None:
    """The mapping arr starts at the start of (as `mapped` made it), or None."""
    root, base = arr, arr.base
    while isinstance(base, np.ndarray):
        root, base = base, base.base
    if (_ADVISE is None or not isinstance(base, memoryview)
            or not isinstance(base.obj, mmap.mmap) or root.ctypes.data != arr.ctypes.data):
        return None
    return base.obj


def release(arr: np.ndarray, upto: int) -> None:
    """Give back the whole pages of arr's first `upto` entries, where arr is (a prefix of) a
    mapping of its own; they read as zeros afterwards."""
    mm = _mapping(arr)
    length = (upto * 4) // _PAGE * _PAGE
    if mm is not None and length > 0:
        mm.madvise(_ADVISE, 0, length)  # type: ignore[arg-type]


def _release_tail(arr: np.ndarray, kept: int) -> None:
    """Give back the whole pages of a mapping past its first `kept` entries."""
    mm = _mapping(arr)
    start = -(-(kept * 4) // _PAGE) * _PAGE
    if mm is not None and start < len(mm):
        mm.madvise(_ADVISE, start, len(mm) - start)  # type: ignore[arg-type]


def _alive(keys: np.ndarray, vals: np.ndarray, dead: Dead | None) -> Run:
    gone = None if dead is None else dead(vals)
    return (keys, vals) if gone is None else (keys[~gone], vals[~gone])


def merge(older: Run, newer: Run, cap: int, keep: str, dead: Dead | None = None,
          step: int = STEP) -> Run:
    """The two runs as one (see the module's docstring); `older`'s entries of a key come
    before `newer`'s. Both inputs are consumed."""
    ok, ov = older
    nk, nv = newer
    n_old, n_new = ok.shape[0], nk.shape[0]
    out_k, out_v = mapped(n_old + n_new), mapped(n_old + n_new)
    i = j = w = 0
    while i < n_old or j < n_new:
        # Older entries up to i2 and the newer ones with smaller keys come next; where the
        # newer run is ahead by more than a step, a step of it and the older entries with keys
        # up to its next one.
        i2 = min(n_old, i + step)
        j2 = n_new if i2 == n_old else int(np.searchsorted(nk[j:], ok[i2], "left")) + j
        if j2 - j > step:
            j2 = j + step
            i2 = int(np.searchsorted(ok[i:], nk[j2], "right")) + i
        a_k, a_v = _alive(ok[i:i2], ov[i:i2], dead)
        b_k, b_v = _alive(nk[j:j2], nv[j:j2], dead)
        n = a_k.shape[0] + b_k.shape[0]
        at_b = np.searchsorted(a_k, b_k, "right") + np.arange(b_k.shape[0])
        from_a = np.ones(n, bool)
        from_a[at_b] = False
        seg_k, seg_v = out_k[w : w + n], out_v[w : w + n]
        seg_k[at_b], seg_v[at_b] = b_k, b_v
        seg_k[from_a], seg_v[from_a] = a_k, a_v
        w += n
        i, j = i2, j2
        for arr, upto in ((ok, i), (ov, i), (nk, j), (nv, j)):
            release(arr, upto)
    n = _cap_in_place(out_k, out_v, w, cap, keep, step)
    for arr in (out_k, out_v):
        _release_tail(arr, n)
    return out_k[:n], out_v[:n]


def _cap_in_place(keys: np.ndarray, vals: np.ndarray, n: int, cap: int, keep: str,
                  step: int) -> int:
    """Keep the first n entries' `cap` last (or first) of each key, in order, at the front;
    how many. Sorted keys: an entry is one of its key's last `cap` unless the entry `cap`
    places after it has the same key (first `cap`: the entry `cap` places before)."""
    w = 0
    behind = np.empty(0, keys.dtype)  # "first": the original keys just before the step
    for a in range(0, n, step):
        b = min(n, a + step)
        ks = keys[a:b]
        if keep == "last":
            ahead = keys[a + cap : min(n, b + cap)]
            drop = np.zeros(b - a, bool)
            drop[: ahead.shape[0]] = ahead == ks[: ahead.shape[0]]
        else:
            ext = np.concatenate((behind, ks))
            drop = ext[cap:] == ext[: ext.shape[0] - cap] if ext.shape[0] > cap else \
                np.zeros(0, bool)
            drop = np.concatenate((np.zeros(b - a - drop.shape[0], bool), drop))
            behind = ext[max(0, ext.shape[0] - cap):].copy()
        if not drop.any():
            if w != a:
                keys[w : w + b - a], vals[w : w + b - a] = ks.copy(), vals[a:b].copy()
            w += b - a
            continue
        kept = ~drop
        m = int(kept.sum())
        keys[w : w + m], vals[w : w + m] = ks[kept], vals[a:b][kept]
        w += m
    return w


def merge_plain(older: Run, newer: Run, cap: int, keep: str, dead: Dead | None = None) -> Run:
    """The reference merge: concatenate, drop the dead, stable sort, cap each key."""
    keys = np.concatenate((older[0], newer[0]))
    vals = np.concatenate((older[1], newer[1]))
    keys, vals = _alive(keys, vals, dead)
    order = np.argsort(keys, kind="stable")  # stable: older ids stay before newer ones
    keys, vals = keys[order], vals[order]
    if keys.shape[0] == 0:
        return keys, vals
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    lengths = np.diff(np.append(starts, keys.shape[0]))
    rank = np.arange(keys.shape[0]) - np.repeat(starts, lengths)
    if keep == "first":
        kept = rank < cap
    else:
        kept = rank >= np.repeat(lengths, lengths) - cap
    return keys[kept], vals[kept]
