"""Worker processes that stop only when their parent says so, and die with it.

    parent (serve, replay) ─┬─ resource tracker   ignores SIGINT/SIGTERM (multiprocessing does)
                            └─ forkserver         ignores SIGINT/SIGTERM/SIGHUP (`_forkserver`)
                                 ├─ worker 1      inherits that; a thread reads `alive`
                                 └─ worker N      and exits at EOF (the parent is gone)

A parent that runs no other thread yet forks its workers itself instead (`pool(fork=True)`):
they start in milliseconds with everything it has loaded, where a forkserver first starts a
new interpreter that imports the package (0.37-0.50 s before the first worker took a task).
Forking is safe only then: a lock another Python thread holds (logging's, an import lock)
would stay held in the child. So a pool started later (serve's, a replacement for a broken
pool) comes from the forkserver. Native threads do not count (OpenBLAS's, RocksDB's with
`--index lsm`): a worker never calls into those libraries, and leaves by os._exit.
A forked worker sets the stop signals to ignored itself (blocked by the parent around the
fork until then), and closes its copy of the `alive` pipe's write end.

Stop signals: Ctrl-C and systemd send SIGINT/SIGTERM (a closed terminal SIGHUP) to the whole
process group. Only the parent may act on them: it finishes the batch in flight and commits
it. A worker killed by them breaks the pool under that batch (BrokenProcessPool), so the
workers ignore them, and so does the forkserver, which would otherwise die of a SIGTERM and
fail the next worker start. The parent blocks them while it starts the forkserver: a signal
that arrives before the forkserver has set them to ignored waits, blocked, and is dropped
then. (The resource tracker, multiprocessing's own, ignores only SIGINT and SIGTERM; the
group-signal test passes with SIGHUP all the same.)

Death of the parent (SIGKILL, OOM): each worker holds the forkserver's "alive" pipe and the
resource tracker's pipe open, and waits on a task queue whose write end it also holds, so
none of them would ever see EOF: forkserver, tracker and workers ran on as orphans. A daemon
thread in each worker reads its pool's `alive` pipe, whose only write end is in the parent;
at EOF the worker exits, the forkserver and the tracker then see their pipes close and exit
too. The pool's shutdown closes that write end too: no worker outlives its pool either.
PR_SET_PDEATHSIG does not fit: a worker's parent is the forkserver, which does not die, and
the forkserver's is whichever thread of ours first started it (it fires when that thread ends).
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import forkserver
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from stream_dedup.workers.cpus import pin

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.2  # how often a wait for a result looks at the workers
LOST_GRACE_S = 2.0  # a worker gone this long with the result still missing: the pool is broken
# The result pipe is widened to this (Linux, up to /proc/sys/fs/pipe-max-size, 1 MiB by
# default): a replay's unit comes back as ~0.5 MB (its pages' analyses and shingle sets),
# and through a 64 KiB pipe the worker waits while this process's result thread, which reads
# a pipe's worth each time it gets the GIL, drains it. In a 1.9 s replay of a 64 MB WARC
# with --workers 2 the worker waited 0.23 s so; the replay took 1.76 s instead of 1.84.
RESULT_PIPE_BYTES = 1 << 20
T = TypeVar("T")


class WorkerPool(ProcessPoolExecutor):
    """A process pool that owns the write end of its workers' `alive` pipe: closing it at
    shutdown makes every worker exit, also one the pool would wait for in vain (a pool
    broken by a worker's death ends the others with SIGTERM, which they ignore).

    A worker killed while it writes a result leaves half a message in the result pipe:
    the pool's manager thread then waits for the rest forever, never looks at its workers
    again, and the task's future never ends (Python 3.11; a stress test here hung within a
    minute). So waiting goes through `result()`, which watches the workers itself, and
    shutdown also closes this process's copy of the result pipe's write end: once the
    workers have exited, the stuck reader gets EOF and the pool ends as broken."""

    def __init__(self, workers: int, ctx: Any, initializer: Callable[..., None],
                 initargs: tuple[Any, ...]) -> None:
        alive, self._alive = multiprocessing.Pipe(duplex=False)
        self._manager: Any = None  # the manager thread once shut down (shutdown)
        # A forked worker holds a copy of the write end too (it must close it, or it would
        # never see EOF); a worker of the forkserver gets only what is passed (pickled).
        forked = ctx.get_start_method() == "fork"
        super().__init__(workers, mp_context=ctx, initializer=_init,
                         initargs=(alive, self._alive if forked else None, initializer,
                                   initargs))
        results: Any = self._result_queue  # a multiprocessing SimpleQueue: a pipe
        try:
            # the pool makes the queue: its pipe ends are not ours to hold, nor public
            reader = results._reader  # noqa: SLF001
            fcntl.fcntl(reader.fileno(), fcntl.F_SETPIPE_SZ, RESULT_PIPE_BYTES)
        except (AttributeError, OSError):
            pass  # not Linux, or capped lower: results wait for the reader as before
        # Every worker now. Left to itself the pool starts one more only when a task comes
        # while none is idle (and counts every finished task as an idle worker), so it could
        # run a while on fewer processes than it was given (a test saw one of two).
        self._launch_processes()

    def pin(self, cpus: Sequence[int]) -> None:
        """Each worker on a CPU of `cpus`, in turn (none: as they are; workers/cpus.py)."""
        for pid, cpu in zip(list(self._processes), cpus, strict=False):  # cpus may be []
            pin(pid, cpu)

    def lost_a_worker(self) -> bool:
        return any(p.exitcode is not None for p in list(self._processes.values()))

    def result(self, f: Future[T], stopped: Callable[[], bool] | None = None) -> T:
        """`f.result()`, or BrokenProcessPool once a worker has been gone for LOST_GRACE_S
        and `f` is still not done (the pool itself would normally have said so by then);
        TimeoutError as soon as `stopped()` says so (the caller stops waiting)."""
        lost_at = None
        while True:
            try:
                return f.result(timeout=POLL_S)
            except FutureTimeout:
                pass
            if stopped is not None and stopped():
                raise FutureTimeout("stopped waiting")
            if lost_at is None:
                lost_at = time.monotonic() if self.lost_a_worker() else None
            elif time.monotonic() - lost_at > LOST_GRACE_S:
                raise BrokenProcessPool("a worker process died and its pool did not see it "
                                        "(killed while sending a result)")

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        # super().shutdown() forgets the manager thread: a second call (after one that did
        # not wait) waits for the one the first saw.
        manager = self._executor_manager_thread or self._manager
        results = self._result_queue
        self._manager = manager
        super().shutdown(wait=False, cancel_futures=cancel_futures)  # forgets both
        self._alive.close()  # idempotent; every worker sees EOF and exits
        if results is not None:
            # (see the class) this process never writes to it
            results._writer.close()  # noqa: SLF001
        if wait and manager is not None:
            manager.join()


def start_forkserver() -> Any:
    """Start the forkserver (once a process; it then imports the package, ~0.3 s, while the
    caller goes on) and return its context."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([f"{__package__}._forkserver"])
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        forkserver.ensure_running()  # inherits the blocked signals (fork and exec keep them)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return ctx


def can_fork() -> bool:
    """Whether workers may be forked from this process now: it runs no other Python thread
    (see the module's docstring for native ones)."""
    return threading.active_count() == 1 and threading.current_thread() is \
        threading.main_thread()


def pool(workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...] = (), *,
         fork: bool = False) -> WorkerPool:
    """A process pool whose workers ignore stop signals and die with this process: forked
    from this process (`fork`, only if `can_fork()`), else from the forkserver."""
    if not fork:
        return WorkerPool(workers, start_forkserver(), initializer, initargs)
    if not can_fork():
        raise RuntimeError("workers are forked only from a process that runs one thread")
    for stream in (sys.stdout, sys.stderr):  # a child would write out what is buffered
        if stream is not None:
            stream.flush()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:  # (WorkerPool forks every worker now)
        return WorkerPool(workers, multiprocessing.get_context("fork"), initializer, initargs)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def ignore_stop_signals() -> None:
    """In the forkserver (see `_forkserver`) or a forked worker: ignore, then unblock, the
    stop signals."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _init(alive: Connection, parent_end: Connection | None, initializer: Callable[..., None],
          initargs: tuple[Any, ...]) -> None:
    if parent_end is not None:  # forked from the parent
        ignore_stop_signals()
        parent_end.close()
    threading.Thread(target=_exit_with_parent, args=(alive,), name="parent-alive",
                     daemon=True).start()
    initializer(*initargs)


def _exit_with_parent(alive: Connection) -> None:
    try:
        alive.recv_bytes()  # nothing is ever sent: this returns only at EOF
    except (EOFError, OSError):
        pass
    os._exit(1)
