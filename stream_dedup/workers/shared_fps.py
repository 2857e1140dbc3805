"""Which bodies each process of a replay has analysed or is about to: a table of body
fingerprints per process, in memory the parent shares with the workers it forks (units.py,
`replay --workers N`). It keeps a copy of a body from being analysed in two processes.

- A worker adds the fingerprint of each body it reads, before analysing it. The parent,
  about to analyse a body in a unit it reads itself, leaves it for later if a worker has it:
  the worker's analysis comes back with its unit, and when the parent's unit is due, the
  units before it are back and their analyses remembered (UnitSource).
- The parent's table holds the bodies whose analyses it remembers (its Memo). A worker that
  finds a body there sends back its fingerprint instead of an analysis, and the parent fills
  it in. A fingerprint leaves the table when the parent forgets that analysis; the parent
  then keeps the analysis until every unit sent out before has come back (UnitSource).

On a WARC of 11 copies of the corpus's pages, 390 bodies were analysed in both processes
without this (0.55 s of CPU in a 5.7 s replay).

One writer a table (its process), so no locks: a slot is one 8-byte word, written whole. A
reader may miss a fingerprint being added, or see a table being rebuilt; then the body is
analysed there, as it was without the tables. A worker's table more than half full is
cleared and refilled; the parent's is rebuilt from what it remembers.
"""

from __future__ import annotations

import mmap
import multiprocessing
from collections.abc import Iterable

SLOTS = 1 << 15  # a table's, a power of 2: 256 KiB, room for 16,384 bodies
_EMPTY, _GONE = 0, 1  # a fingerprint that is either is not shared


class _Table:
    """Open addressing (linear probing) over a shared array of 8-byte words (a memoryview:
    a word read costs a third of a numpy element's)."""

    def __init__(self, words: memoryview) -> None:
        self.words = words
        self.mask = len(words) - 1
        self.used = 0  # slots not empty (fingerprints and gone marks): the writer's count

    def find(self, fp: int) -> int:
        """The slot of `fp`, or -1."""
        words, i = self.words, fp & self.mask
        for _ in range(len(words)):
            held = words[i]
            if held == fp:
                return i
            if held == _EMPTY:
                return -1
            i = (i + 1) & self.mask
        return -1

    def add(self, fp: int) -> None:
        if self.find(fp) >= 0:
            return
        words, i = self.words, fp & self.mask
        while words[i] not in (_EMPTY, _GONE):
            i = (i + 1) & self.mask
        self.used += words[i] == _EMPTY
        words[i] = fp

    def full(self) -> bool:
        return self.used * 2 >= len(self.words)

    def clear(self) -> None:
        self.words[:] = memoryview(bytes(8 * len(self.words))).cast("Q")
        self.used = 0


class SharedFingerprints:
    """Made in the parent before it forks the workers (an anonymous shared mapping is
    inherited across fork, not passed in a pickle); each worker `claim()`s a table."""

    def __init__(self, processes: int, slots: int = SLOTS) -> None:
        if slots < 2 or slots & (slots - 1):
            raise ValueError(f"slots must be a power of 2, got {slots}")
        self._mem = mmap.mmap(-1, 8 * (1 + (processes + 1) * slots))  # word 0: claimed
        words = memoryview(self._mem).cast("Q")
        self._claimed = words[:1]
        tables = [_Table(words[1 + i * slots:1 + (i + 1) * slots])
                  for i in range(processes + 1)]
        self._workers, self._parent = tables[:-1], tables[-1]
        self._lock = multiprocessing.get_context("fork").Lock()
        self._mine: _Table | None = None  # a worker's own table

    # --- in a worker ----------------------------------------------------------------------
    def claim(self) -> None:
        """Take the next free table (once, in a worker; there is one a worker)."""
        with self._lock:
            n = self._claimed[0]
            if n >= len(self._workers):
                return  # more workers than tables (never here): this one shares nothing
            self._claimed[0] = n + 1
        self._mine = self._workers[n]

    def reading(self, fp: int) -> None:
        """Say that this worker analyses (or has) the body of fingerprint `fp`."""
        table = self._mine
        if table is None or fp in (_EMPTY, _GONE):
            return
        if table.full():
            table.clear()
        table.add(fp)

    def in_parent(self, fp: int) -> bool:
        """Whether the parent remembers the analysis of `fp`'s body (see the module)."""
        return fp not in (_EMPTY, _GONE) and self._parent.find(fp) >= 0

    # --- in the parent ----------------------------------------------------------------------
    def in_worker(self, fp: int) -> bool:
        """Whether a worker has said it analyses `fp`'s body (a hint: see the module)."""
        return fp not in (_EMPTY, _GONE) and any(t.find(fp) >= 0 for t in self._workers)

    def remember(self, fp: int, remembered: Iterable[int]) -> None:
        """The parent remembers `fp`'s analysis (`remembered`: all it does, for a rebuild)."""
        if fp in (_EMPTY, _GONE):
            return
        table = self._parent
        if table.full():
            table.clear()
            for held in remembered:
                if held not in (_EMPTY, _GONE):
                    table.add(held)
        table.add(fp)

    def forget(self, fp: int) -> None:
        """The parent no longer remembers `fp`'s analysis."""
        i = self._parent.find(fp) if fp not in (_EMPTY, _GONE) else -1
        if i >= 0:
            self._parent.words[i] = _GONE
