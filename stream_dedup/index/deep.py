"""The memory index's deep containment keys (core/contain.py deep_keys): key -> rows on disk.

A kept page stores ~1/8 of its shingles as deep keys (~85 for a mean web page): 8 bytes
an entry would be ~700 bytes a page in RAM, three times the whole index. So the entries
live in sorted runs in unlinked temporary files (the records' directory, arena.py
records_home; a memfd, in RAM, when the records are), and RAM holds only

- the newest entries, in an open-addressing table of uint64 slots, written out as one run
  when it is half full, the next one twice the size, up to SLOTS (4 MiB): a store that
  holds little costs little;
- while it is written out, that table too (read-only, still asked), beside a new one;
- each run's fences: the first key of each block of BLOCK entries (0.008 bytes an entry).

An entry is one uint64, key << 32 | row (the key's low 32 bits): sorted as integers, the
entries of a key are in row order, oldest first. A lookup reads, in each run, the block
its key may be in (one pread); a page asks with a few keys (contain_deep_asked), so a kept
page costs ~3 x runs reads (the kernel: core/_deep.c; the Python twins here). Runs are
merged as the memory index merges its own (the newer at least a quarter of the older), a
step at a time from file to file, so the runs are few (log4 of the entries over SLOTS / 2)
and a merge holds two steps in RAM. A spill and its merges run in a thread of their own
(at 1M pages of 85 keys they take 1.1-1.5 s: in the storing call, a stall of the deciding
thread): it reads runs no one writes and makes new ones; the caller swaps them in at a later store
(`settle`), and waits for it only if the new table is full first. Each key keeps its
`cap` most recent rows: a key that many pages share is a site's template (contain_common),
not a lead. Rows that are gone (`dead`) are dropped by the spills and merges that meet them.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np

from stream_dedup.core import native as _native  # None: the Python twins
from stream_dedup.errors import IndexStoreError

BLOCK = 512  # entries a block (4 KiB): a fence each
SLOTS = 1 << 19  # the newest entries' table (4 MiB), written out as a run half full
_FIRST_SLOTS = 1 << 12  # its size at first: doubled at each spill, up to SLOTS
STEP = 1 << 16  # entries a merge step reads from each run (512 KiB)
EMPTY = np.uint64(0xFFFF_FFFF_FFFF_FFFF)
_LOW32 = np.uint64(0xFFFF_FFFF)
_32 = np.uint64(32)


class _Run:
    """One run of sorted entries in its own unlinked file (a memfd: in RAM)."""

    def __init__(self, directory: str | None) -> None:
        try:
            if directory is None:
                self.file = os.fdopen(os.memfd_create("stream-dedup-deep"), "rb", buffering=0)
            else:
                self.file = tempfile.TemporaryFile(dir=directory, prefix="stream-dedup-deep-",
                                                   buffering=0)
        except OSError as exc:
            raise IndexStoreError(f"cannot make a deep-key run file in {directory or 'RAM'}: "
                                  f"{exc} (choose another directory with "
                                  f"--memory-records-dir)") from exc
        self.close = weakref.finalize(self, self.file.close)
        self.fd = self.file.fileno()
        self.n = 0
        self._fences: list[np.ndarray] = []
        self.fences = np.zeros(0, np.uint32)  # the first key of each block

    def append(self, entries: np.ndarray) -> None:
        """Sorted entries, after the ones written (a run is written once, in order)."""
        if not entries.shape[0]:
            return
        data = entries.astype("<u8", copy=False).data.cast("B")
        done = 0
        while done < len(data):  # a full disk raises here
            done += os.pwrite(self.fd, data[done:], self.n * 8 + done)
        first = (-self.n) % BLOCK  # the next block's start within these entries
        self._fences.append((entries[first::BLOCK] >> _32).astype(np.uint32))
        self.n += entries.shape[0]

    def seal(self) -> _Run:
        if self._fences:
            self.fences = np.concatenate(self._fences)
            self._fences = []
        return self

    def read(self, start: int, count: int) -> np.ndarray:
        count = max(0, min(count, self.n - start))
        return np.frombuffer(os.pread(self.fd, count * 8, start * 8), "<u8").astype(np.uint64)

    def rows(self, key: int) -> list[int]:
        """The rows of one key (its low 32 bits), oldest first (the kernel's twin)."""
        fences = self.fences
        lo = int(np.searchsorted(fences, key, "left"))
        end = int(np.searchsorted(fences, key, "right"))
        first = max(lo - 1, 0)
        entries = self.read(first * BLOCK, max(end - first, 1) * BLOCK)
        a, b = np.searchsorted(entries >> _32, [key, key + 1])
        return [int(r) for r in entries[a:b] & _LOW32]


def _capped(entries: np.ndarray, cap: int, dead: Callable[[np.ndarray], np.ndarray | None]
            ) -> np.ndarray:
    """Sorted entries without the dead rows, each key's last `cap`: an entry is past its
    key's cap when the entry `cap` places on has the same key."""
    gone = dead((entries & _LOW32).astype(np.uint32))
    if gone is not None:
        entries = entries[~gone]
    keys = entries >> _32
    if keys.shape[0] <= cap:
        return entries
    over = keys[:-cap] == keys[cap:]
    if not over.any():
        return entries
    kept: np.ndarray = entries[np.concatenate((~over, np.ones(cap, bool)))]
    return kept


class DeepLayout(NamedTuple):
    """Where a MemoryIndex's deep containment keys are: a kept page's keys past its first
    `stored`, a probe's last `asked`; a deep key holds `cap` rows. asked 0: none apart."""

    stored: int
    asked: int
    cap: int


NO_DEEP_KEYS = DeepLayout(0, 0, 0)


class DeepKeys:
    """Deep containment key -> the `cap` most recent rows holding it."""

    def __init__(self, directory: str | None, cap: int,
                 dead: Callable[[np.ndarray], np.ndarray | None]) -> None:
        """`directory` None: the runs in RAM (memfd files)."""
        self.directory, self.cap, self.dead = directory, cap, dead
        self._table = np.full(min(SLOTS, _FIRST_SLOTS), EMPTY, np.uint64)
        self._held = 0
        self.runs: list[_Run] = []
        self._frozen: np.ndarray | None = None  # a full table, being written out
        self._writer: _Writer | None = None  # the thread writing it out
        self.longest_write = 0.0  # seconds: the longest a writer took (bench/deep_keys.py)

    def add(self, keys: np.ndarray, row: int) -> None:
        """One kept page's deep keys (uint64; the low 32 bits are stored). Raises the
        IndexStoreError of a run that could not be written (the page is not added)."""
        keys = np.ascontiguousarray(keys, np.uint64)
        self.settle(wait=False)
        if self._held + keys.shape[0] > self._table.shape[0] // 2:
            self.spill(wait=False)
        self._insert(self._table, keys, row)
        self._held += keys.shape[0]

    @staticmethod
    def _insert(table: np.ndarray, keys: np.ndarray, row: int) -> None:
        """`row` under each key."""
        if _native is not None:
            _native.held_add(table, keys, row)
            return
        mask = table.shape[0] - 1
        for key in keys.tolist():
            slot = _slot(key & 0xFFFF_FFFF) & mask
            while table[slot] != EMPTY:
                slot = (slot + 1) & mask
            table[slot] = (key & 0xFFFF_FFFF) << 32 | row

    def postings(self, keys: np.ndarray) -> list[list[int]]:
        """Each key's `cap` most recent rows (uint64 keys), a list per key."""
        keys = np.ascontiguousarray(keys, np.uint64)
        runs, frozen = self.runs, self._frozen
        if frozen is None:
            return self._get(self._table, runs, keys)
        older = self._get(frozen, runs, keys)
        return [(a + b)[-self.cap:] for a, b in zip(older, self._get(
            self._table, [], keys), strict=True)]

    def _get(self, table: np.ndarray, runs: list[_Run], keys: np.ndarray) -> list[list[int]]:
        """Each key's `cap` most recent rows in `runs` (oldest first), then `table`."""
        if _native is not None:
            got: list[list[int]] = _native.deep_get(
                table, [(run.fd, run.fences) for run in runs], BLOCK, keys, self.cap)
            return got
        out = []
        mask = table.shape[0] - 1
        for key in (keys & _LOW32).tolist():
            rows = [r for run in runs for r in run.rows(key)]
            slot = _slot(key) & mask
            while table[slot] != EMPTY:
                if int(table[slot]) >> 32 == key:
                    rows.append(int(table[slot]) & 0xFFFF_FFFF)
                slot = (slot + 1) & mask
            out.append(rows[-self.cap:])
        return out

    def spill(self, wait: bool = True) -> None:
        """Write the entries held out as a run, and merge runs of similar size, in a thread
        (`wait`: and wait for it). One at a time: a spill waits for the last one, and first
        writes out again a table whose write failed. A write that fails (a full disk)
        raises IndexStoreError (at the store that finds it) and loses nothing: the table
        stays, asked, and the runs as they were."""
        self.settle(wait=True)
        if self._frozen is not None:  # its write failed
            self._writer = _Writer(self._write_out, self._frozen, self.runs)
            self.settle(wait=True)
        if self._held:
            self._frozen, self._held = self._table, 0
            self._table = np.full(min(SLOTS, self._frozen.shape[0] * 2), EMPTY, np.uint64)
            self._writer = _Writer(self._write_out, self._frozen, self.runs)
        if wait:
            self.settle(wait=True)

    def settle(self, wait: bool = True) -> None:
        """Swap in the runs the writer made once it is done (`wait`: wait for it); raise
        its error."""
        writer = self._writer
        if writer is None or not (wait or writer.done.is_set()):
            return
        writer.done.wait()
        self._writer = None
        self.longest_write = max(self.longest_write, writer.seconds)
        if writer.error is not None:
            raise writer.error
        replaced = set(self.runs) - set(writer.runs)
        self.runs, self._frozen = writer.runs, None
        for run in replaced:
            run.close()

    def _write_out(self, table: np.ndarray, runs: list[_Run]) -> list[_Run]:
        """(In the writer's thread.) The runs with `table`'s entries as one more, merged
        while the newest is at least a quarter of the one before; on an error, the runs
        made here are closed."""
        runs, made = list(runs), []
        try:
            held = table[table != EMPTY]
            held.sort()
            runs.append(self._written(lambda run: run.append(
                _capped(held, self.cap, self.dead)), made))
            while len(runs) >= 2 and runs[-1].n * 4 >= runs[-2].n:
                runs[-2:] = [self._written(partial(self._merge, *runs[-2:]), made)]
        except BaseException:
            for run in made:
                run.close()
            raise
        for run in made:
            if run not in runs:  # merged again: no one else knew it
                run.close()
        return runs

    def _written(self, write: Callable[[_Run], None], made: list[_Run]) -> _Run:
        """A new run `write` fills (listed in `made`); on an error, none."""
        run = _Run(self.directory)
        made.append(run)
        try:
            write(run)
        except OSError as exc:
            run.close()
            raise IndexStoreError(f"cannot write the deep containment keys' run in "
                                  f"{self.directory or 'RAM'}: {exc} (free space there, or "
                                  f"choose another directory with --memory-records-dir)"
                                  ) from exc
        return run.seal()

    def _merge(self, older: _Run, newer: _Run, out: _Run) -> None:
        """The two runs as one, into `out`, a step at a time: each step takes from both the
        entries of keys below the smaller of the two steps' last keys (whose rows may go on
        past the step), all of them once both are read to the end. A step has more than
        `cap` entries, so more than one key (a run holds `cap` a key): each step takes
        some. The older run's rows are the older, so the entries sorted are in order."""
        step = max(STEP, self.cap + 1)
        i = j = 0
        while i < older.n or j < newer.n:
            a, b = older.read(i, step), newer.read(j, step)
            bound = min(int(a[-1]) >> 32 if i + a.shape[0] < older.n else 1 << 32,
                        int(b[-1]) >> 32 if j + b.shape[0] < newer.n else 1 << 32)
            below = np.uint64(min(bound << 32, (1 << 64) - 1))
            a = a[: np.searchsorted(a, below, "left")]
            b = b[: np.searchsorted(b, below, "left")]
            both = np.concatenate((a, b))
            both.sort(kind="stable")  # (two sorted runs: timsort merges them in one pass)
            out.append(_capped(both, self.cap, self.dead))
            i += a.shape[0]
            j += b.shape[0]

    def __len__(self) -> int:
        frozen = 0 if self._frozen is None else int(np.count_nonzero(self._frozen != EMPTY))
        return self._held + frozen + sum(run.n for run in self.runs)

    def nbytes(self) -> dict[str, int]:
        """Bytes in RAM (the tables, the fences) and in the runs."""
        frozen = 0 if self._frozen is None else self._frozen.nbytes
        return {"ram": self._table.nbytes + frozen +
                sum(run.fences.nbytes for run in self.runs),
                "on_disk": sum(run.n for run in self.runs) * 8}

    def close(self) -> None:
        """Wait for the writer (its runs, or its error, are dropped); close the runs."""
        try:
            self.settle(wait=True)
        except IndexStoreError:
            pass
        for run in self.runs:
            run.close()
        self.runs, self._frozen = [], None


class _Writer:
    """A thread that runs `write(table, runs)` once: its new runs, or its error."""

    def __init__(self, write: Callable[[np.ndarray, list[_Run]], list[_Run]],
                 table: np.ndarray, runs: list[_Run]) -> None:
        self.runs: list[_Run] = []
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.done = threading.Event()
        # Not a daemon: an exit waits for it (a second at most) rather than kill it mid-call.
        threading.Thread(target=self._run, args=(write, table, runs),
                         name="deep-keys-writer").start()

    def _run(self, write: Callable[[np.ndarray, list[_Run]], list[_Run]],
             table: np.ndarray, runs: list[_Run]) -> None:
        started = time.perf_counter()
        try:
            self.runs = write(table, runs)
        except BaseException as exc:  # raised in the storing thread (settle)
            self.error = exc
        finally:
            self.seconds = time.perf_counter() - started
            self.done.set()


def _slot(key: int) -> int:
    """The kernel's mix64 of a key: its first slot (before the table's mask)."""
    x = key
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFF_FFFF_FFFF_FFFF
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & 0xFFFF_FFFF_FFFF_FFFF
    return x ^ (x >> 31)
