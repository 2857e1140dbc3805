"""SIGTERM, SIGINT and SIGHUP stop `serve`, from the first moment of the process to its last.

Kubernetes (or systemd, or Ctrl-C) may signal at any time: while the modules load, while the
index is read or restored, in a rebalance, while the clients close. The default action of
SIGTERM kills the process (rc -15), so the handler is installed before anything slow (the
package's `__init__`, first thing, for `stream-dedup serve`; `serve()` again), records a
signal that comes before the service's loop runs, and is never given back to the default
(asyncio's `add_signal_handler` is not used: closing the loop would restore SIG_DFL, and a
second signal while the process exits would kill it).

A stop must end the process within the orchestrator's grace period, whatever is stuck: the
first signal also arms a watchdog. If the process still runs SHUTDOWN_DEADLINE_S later, it
writes every thread's stack and the line "shutdown did not finish" to stderr and leaves
with exit code 0 at once, as a SIGKILL would end it (nothing uncommitted is lost: it is
delivered again, or its transaction aborted). Tests look for that line: reaching the
deadline is a bug to find, not a way out.

This module imports nothing heavy: the command line installs it before the rest loads.
What it cannot cover is the interpreter's own start (0.2-0.3 s on the test VM, before any
of this package runs): a SIGTERM then kills the process (rc -15) unless it is PID 1 of a
container, which ignores it (the orchestrator's SIGKILL ends it after the grace).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("stream_dedup.service")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: a closed terminal
SHUTDOWN_DEADLINE_S = 20.0  # from the first signal to the exit, at the most


class StopSignals:
    def __init__(self, deadline_s: float = SHUTDOWN_DEADLINE_S) -> None:
        self.deadline_s = deadline_s
        self.first: signal.Signals | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._installed = False

    def install(self) -> bool:
        """Handle the stop signals from now on; False where it cannot (not the main
        thread: a test running the service in a thread stops it by its event)."""
        if self._installed:
            return True
        try:
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._handle)
        except ValueError:
            return False
        self._installed = True
        return True

    def attach(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
        """A signal (received already, or later) sets `stop` in `loop`."""
        self._loop, self._stop = loop, stop
        if self.first is not None:
            self._stopping(self.first)

    def detach(self) -> None:
        self._loop = self._stop = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.first is None:
            self.first = sig
            watchdog = threading.Timer(self.deadline_s, self._too_late)
            watchdog.daemon = True
            watchdog.start()
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._stopping, sig)
            except RuntimeError:  # the loop closed meanwhile: exiting already
                pass

    def _stopping(self, sig: signal.Signals) -> None:
        stop = self._stop
        if stop is not None and not stop.is_set():
            log.info("%s: finishing the batch in flight, then exiting", sig.name)
            stop.set()

    def _too_late(self) -> None:
        sys.stderr.write(f"stream-dedup: shutdown did not finish within {self.deadline_s:.0f} s "
                         "of the stop signal; exiting now. The threads' stacks:\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)
        os._exit(0)


SIGNALS = StopSignals()
