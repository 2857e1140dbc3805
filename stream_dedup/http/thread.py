"""An aiohttp app served from a thread of its own, for synchronous callers (replay).

`serve` runs its app in the event loop of the Kafka runner instead (kafka/service.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from types import TracebackType

from aiohttp import web

from stream_dedup.http.app import app_runner


class BackgroundServer:
    """`with BackgroundServer(app, host, port):` serves `app` until the block ends.
    A port that cannot be bound raises OSError on entry; once entered, `port` is the port
    bound (with port 0, the one the system chose). `runner` makes the app's runner: by
    default the service's (`build_app`'s apps only)."""

    def __init__(self, app: web.Application, host: str, port: int,
                 runner: Callable[[web.Application], web.AppRunner] = app_runner) -> None:
        self.app, self.host, self.port, self._runner = app, host, port, runner
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="http", daemon=True)

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        runner = self._runner(self.app)
        try:
            await runner.setup()
            await web.TCPSite(runner, self.host, self.port).start()
            self.port = runner.addresses[0][1]
        except BaseException as exc:
            self._error = exc
            await runner.cleanup()
            self._ready.set()
            return
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
