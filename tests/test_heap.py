"""The command line keeps freed heap memory for reuse (stream_dedup/workers/heap.py): a second page
as big as the first takes its memory without page faults."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from stream_dedup.workers import pool as workers

PAGES = (300 * (64 << 10)) // 4096
glibc = pytest.mark.skipif(not hasattr(os, "confstr") or not os.confstr("CS_GNU_LIBC_VERSION"),
                           reason="glibc's malloc only")


def _round() -> None:
    """300 blocks of 64 KiB (~19 MiB, as a big page's DOM takes in lexbor's blocks),
    every page touched, then freed."""
    blocks = [bytearray(64 << 10) for _ in range(300)]
    for b in blocks:
        b[::4096] = b"x" * len(b[::4096])
    del blocks


def _second_round_faults() -> int:
    _round()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    _round()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _faults_in_a_new_interpreter(tmp_path: Path, cli: bool) -> int:
    """After `stream-dedup sample` ran in it (`cli`), or nothing."""
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "from test_heap import _second_round_faults\n"
              + (f"from stream_dedup.cli import main; main.main(['sample', {str(tmp_path)!r}])\n"
                 if cli else "")
              + "print(_second_round_faults())")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True)
    return int(out.stdout.split()[-1])


@glibc
def test_the_command_line_reuses_freed_memory_without_faults(tmp_path: Path) -> None:
    # glibc's default: given back at once, faulted in again
    assert _faults_in_a_new_interpreter(tmp_path, cli=False) > PAGES // 2
    assert _faults_in_a_new_interpreter(tmp_path, cli=True) < PAGES // 20


@glibc
def test_so_do_the_workers_the_forkserver_starts() -> None:
    with workers.pool(1, _noop) as executor:
        assert executor.submit(_second_round_faults).result(timeout=60) < PAGES // 20


def _noop() -> None:
    pass
