"""A real browser for the report's tests: headless Chromium (Debian's `chromium`, installed
by tests/run), driven over the DevTools protocol with aiohttp's websocket client.

`render(path)` opens a file as a person would, waits for its load event, and returns what
the page did: the value of a DOM expression, every console message, exception and log
entry (a Content-Security-Policy refusal is one), every request the page made, and a
screenshot of the whole page (PNG bytes)."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Rendered:
    value: Any
    screenshot: bytes
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, log errors
    requests: list[str] = field(default_factory=list)  # URLs the page asked for


def render(path: Path, expression: str, *, width: int = 1280, timeout: float = 60) -> Rendered:
    exe = chromium()
    assert exe, "chromium is not installed (tests/run installs it)"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={profile}",
             f"--window-size={width},900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port = _port(Path(profile) / "DevToolsActivePort")
            return asyncio.run(asyncio.wait_for(
                _render(port, path.resolve().as_uri(), expression, width), timeout))
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _port(file: Path) -> int:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if file.exists() and file.read_text().strip():
            return int(file.read_text().split()[0])
        time.sleep(0.05)
    raise AssertionError("chromium did not open its DevTools port")


async def _render(port: int, url: str, expression: str, width: int) -> Rendered:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
            targets = await r.json()
        ws_url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with http.ws_connect(ws_url, max_msg_size=0) as ws:
            return await _drive(_Session(ws), url, expression, width)


class _Session:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.n = 0
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        await self.ws.send_str(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg["result"]  # type: ignore[no-any-return]
            self.events.append(msg)

    async def until(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(json.loads((await self.ws.receive()).data))


async def _drive(s: _Session, url: str, expression: str, width: int) -> Rendered:
    for domain in ("Page", "Runtime", "Log", "Network"):
        await s.call(f"{domain}.enable")
    await s.call("Page.navigate", url=url)
    await s.until("Page.loadEventFired")
    await asyncio.sleep(0.2)  # late console messages
    out = await s.call("Runtime.evaluate", expression=expression, returnByValue=True)
    metrics = await s.call("Page.getLayoutMetrics")
    height = min(int(metrics["cssContentSize"]["height"]), 16000)
    shot = await s.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                        clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
    rendered = Rendered(out["result"].get("value"), base64.b64decode(shot["data"]))
    for e in s.events:
        p = e.get("params", {})
        if e.get("method") == "Runtime.exceptionThrown":
            rendered.errors.append(json.dumps(p["exceptionDetails"])[:500])
        elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error",
                                                                               "warning"):
            rendered.errors.append(json.dumps(p.get("args"))[:500])
        elif e.get("method") == "Log.entryAdded" and p["entry"]["level"] in ("error",
                                                                            "warning"):
            rendered.errors.append(p["entry"].get("text", "")[:500])
        elif e.get("method") == "Network.requestWillBeSent":
            rendered.requests.append(p["request"]["url"])
    return rendered
