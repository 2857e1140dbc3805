"""Which CPU each process of a replay runs on: one of its own, when they fill the CPUs.

A replay with --workers N runs N processes: this one (reading, deciding, writing: several
threads that take turns at one GIL, so one CPU's worth at a time) and N-1 analysis
workers. Left to the kernel, a thread of this process that gets the GIL is often woken
on the CPU a worker runs on: the worker waits, or both move (`perf stat`: 52 CPU
migrations in a replay of the issue's WARC, 3-6 placed), and what the thread handed
over was in the other CPU's cache. When the N processes are as many as the CPUs
this process may use, each gets one of its own: this process's threads the first, each
worker another (on 2 cores, `--workers 2` did the issue's 62 MB WARC 3-9 % faster so in
A/B runs; bench/RESULTS.md).

Only then: a job that does not fill its CPUs is left to the kernel, so that two replays
started side by side never share one CPU while another idles. To run several filling
jobs on one machine, give each its CPUs (taskset -c, a cgroup's cpuset): the placement is
made among the CPUs the process may use.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator

log = logging.getLogger(__name__)


def allowed() -> set[int]:
    """The CPUs this thread may run on (empty where the platform does not say)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return set(getaffinity(0)) if getaffinity is not None else set()


def placement(processes: int, cpus: Iterable[int]) -> list[int] | None:
    """One CPU each for `processes` processes (this one first), when they are as many as
    `cpus` and more than one; else None: the kernel places them."""
    ordered = sorted(cpus)
    return ordered if processes > 1 and len(ordered) == processes else None


def pin(pid: int, cpu: int) -> bool:
    """Run `pid` (0: the calling thread; a process: its main thread, and the threads it
    starts later) on `cpu` only. False where it may not (the CPU was taken away, no such
    process, no sched_setaffinity)."""
    try:
        os.sched_setaffinity(pid, {cpu})
    except (AttributeError, OSError) as exc:
        log.debug("not pinned to CPU %d (%s): the kernel places it", cpu, exc)
        return False
    return True


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """The calling thread, and the threads it starts meanwhile, on `cpu` (None: as they
    are); its CPUs as they were afterwards (replay is also a library call)."""
    before = allowed()
    if cpu is None or not before or not pin(0, cpu):
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, before)
