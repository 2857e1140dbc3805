"""How the command line's processes keep their heap (glibc's malloc; elsewhere nothing).

Parsing a page builds its DOM in lexbor's blocks (~12 bytes a byte of HTML: ~22 MB for a
1.7 MB page) and frees them at the end. glibc gives that memory back at once: it trims the
top of the heap once 128 KiB there is free and maps a block of 128 KiB or more afresh, so
the next big page faults every page in again (5,500 faults an analysis of that page,
which took 56 ms; on a 65 MB WARC of new text `--workers 2`, whose worker starts with a
heap of its own, took 53,000 more faults than `--workers 1`). Kept (free memory up to
KEEP_FREE stays at the top of the heap; blocks under MAP_FROM come from the heap), the same
analysis faults nothing and takes 32 ms. The peak RSS hardly moves (what stays is what a
page already took): `replay` of 1M synthetic pages, 216 B a page held against 212
(bench/replay_memory.py).

The command line's process sets this (cli.main; forked workers inherit it), and so do the
analysis workers the forkserver starts (workers/_forkserver.py); a library user's own process keeps
its malloc settings.
"""

from __future__ import annotations

import ctypes
import os

KEEP_FREE = 64 << 20  # M_TRIM_THRESHOLD
MAP_FROM = 32 << 20  # M_MMAP_THRESHOLD (glibc's largest on 64-bit)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h


def keep_heap() -> bool:
    """Keep freed memory for reuse (see the module); False where malloc is not glibc's."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):  # no such confstr name, no libc symbol
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # (Either setting also turns off glibc's own adjusting of both, which grows them only
    # when a mapped block is freed: a parse's blocks are mostly below the threshold.)
    return bool(mallopt(_M_MMAP_THRESHOLD, MAP_FROM)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, KEEP_FREE))
