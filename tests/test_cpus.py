"""Where a replay's processes run (workers/cpus.py): one CPU each only when they fill the CPUs the
process may use; the calling thread's CPUs as they were afterwards. And the command line
starts no BLAS threads (stream_dedup/__init__.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from stream_dedup.workers.cpus import allowed, pinned, placement

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                    reason="no sched_setaffinity here")


@pytest.mark.parametrize(("processes", "cpus", "placed"), [
    (2, {0, 1}, [0, 1]),
    (2, {5, 3}, [3, 5]),  # what taskset gave: those, in order
    (4, {0, 1, 2, 3}, [0, 1, 2, 3]),
    (2, {0, 1, 2, 3}, None),  # fewer than the CPUs: another job may want the rest
    (3, {0, 1}, None),  # more than the CPUs: they must share
    (1, {0}, None),  # one process: nothing to keep apart
])
def test_processes_are_placed_only_when_they_fill_the_cpus(
        processes: int, cpus: set[int], placed: list[int] | None) -> None:
    assert placement(processes, cpus) == placed


@needs_affinity
def test_a_pinned_thread_and_the_threads_it_starts_run_on_one_cpu_until_it_ends() -> None:
    before = allowed()
    cpu = max(before)
    inside: list[set[int]] = []
    with pinned(cpu):
        inside.append(allowed())
        t = threading.Thread(target=lambda: inside.append(allowed()))
        t.start()
        t.join()
    assert inside == [{cpu}, {cpu}]
    assert allowed() == before
    with pinned(None):
        assert allowed() == before


@pytest.mark.parametrize(("argv0", "preset", "seen"), [
    ("-m", None, "1"),  # python -m stream_dedup, while the package is imported
    ("/usr/local/bin/stream-dedup", None, "1"),  # the console script
    ("-m", "4", "4"),  # the user's setting stands
    ("my_crawler.py", None, None),  # a library user's process: untouched
])
def test_the_command_line_starts_no_blas_threads(
        argv0: str, preset: str | None, seen: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    code = (f"import sys; sys.argv = [{argv0!r}]; import os, stream_dedup; "
            "print(os.environ.get('OPENBLAS_NUM_THREADS'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == str(seen)
