"""Worker processes that stop only when their parent says so, and die with it.

    parent (serve, replay) ─┬─ resource tracker   ignores SIGINT/SIGTERM (multiprocessing does)
                            └─ forkserver         ignores SIGINT/SIGTERM (`_forkserver` preload)
                                 ├─ worker 1      inherits that; a thread reads `_ALIVE`
                                 └─ worker N      and exits at EOF (the parent is gone)

Stop signals: Ctrl-C and systemd send SIGINT/SIGTERM to the whole process group. Only the
parent may act on them: it finishes the batch in flight and commits it. A worker killed by
them breaks the pool under that batch (BrokenProcessPool), so the workers ignore them, and so
does the forkserver, which would otherwise die of a SIGTERM and fail the next worker start.
The parent blocks both while it starts the forkserver: a signal that arrives before the
forkserver has set them to ignored waits, blocked, and is dropped then.

Death of the parent (SIGKILL, OOM): each worker holds the forkserver's "alive" pipe and the
resource tracker's pipe open, and waits on a task queue whose write end it also holds, so
none of them would ever see EOF: forkserver, tracker and workers ran on as orphans. A daemon
thread in each worker reads `_ALIVE`, a pipe whose only write end is in the parent; at EOF the
worker exits, the forkserver and the tracker then see their pipes close and exit too.
PR_SET_PDEATHSIG does not fit: a worker's parent is the forkserver, which does not die, and
the forkserver's is whichever thread of ours first started it (it fires when that thread ends).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# Read end (sent to every worker) and write end (never leaves this process) of the pipe that
# tells a worker its parent is alive. One per process, open until the process ends.
_ALIVE: tuple[Connection, Connection] | None = None
_ALIVE_LOCK = threading.Lock()


def pool(workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...] = ()
         ) -> ProcessPoolExecutor:
    """A forkserver process pool whose workers ignore stop signals and die with this process."""
    global _ALIVE
    with _ALIVE_LOCK:
        if _ALIVE is None:
            _ALIVE = multiprocessing.Pipe(duplex=False)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([f"{__package__}._forkserver"])
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        forkserver.ensure_running()  # inherits the blocked signals (fork and exec keep them)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                               initargs=(_ALIVE[0], initializer, initargs))


def ignore_stop_signals() -> None:
    """In the forkserver (see `_forkserver`): ignore, then unblock, SIGINT and SIGTERM."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _init(alive: Connection, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
    threading.Thread(target=_exit_with_parent, args=(alive,), name="parent-alive",
                     daemon=True).start()
    initializer(*initargs)


def _exit_with_parent(alive: Connection) -> None:
    try:
        alive.recv_bytes()  # nothing is ever sent: this returns only at EOF
    except (EOFError, OSError):
        pass
    os._exit(1)
