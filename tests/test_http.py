"""The HTTP API in process (aiohttp's test client): every endpoint, good and bad requests."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opskit import free_port, get, get_json, reordered_pair, sample_names, samples

from stream_dedup import Deduplicator, Page, Settings
from stream_dedup.cli.main import main
from stream_dedup.cli.sample import build
from stream_dedup.http import ApiState, Check, build_app
from stream_dedup.http.app import max_request_bytes
from stream_dedup.http.thread import BackgroundServer
from stream_dedup.metrics import Metrics

SETTINGS = Settings(max_page_bytes=40_000)
HTML = {"Content-Type": "text/html; charset=utf-8"}


def _state(settings: Settings = SETTINGS, **kw: Any) -> ApiState:
    metrics = Metrics(settings)
    dedup = kw.pop("dedup", Deduplicator(settings, observer=metrics))
    return ApiState(settings, metrics, dedup, **kw)


@asynccontextmanager
async def _client(state: ApiState) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(build_app(state))) as client:
        yield client


def _run(state: ApiState, go: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def main() -> None:
        async with _client(state) as client:
            await go(client)
    asyncio.run(main())


def _seeded(state: ApiState) -> list[Page]:
    assert state.dedup is not None
    pages = [Page(p.url, p.html.encode(), (("Content-Type", HTML["Content-Type"]),))
             for p in build(seed=3)]
    state.dedup.check_batch(pages)
    return pages


# --- health, readiness, metrics ------------------------------------------------------------
def test_healthz_and_metrics() -> None:
    state = _state()
    _seeded(state)

    async def go(c: TestClient[Any, Any]) -> None:
        r = await c.get("/healthz")
        assert r.status == 200 and await r.json() == {"status": "ok"}
        r = await c.get("/metrics")
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        text = await r.text()
        assert 'stream_dedup_pages_total{decision="drop",reason="near"}' in text
        assert "process_resident_memory_bytes" in sample_names(text)
    _run(state, go)


def test_readyz_reports_each_check() -> None:
    async def broker_down() -> Check:
        return Check(False, "no metadata from kafka:9092 (KafkaConnectionError)")

    async def go_ready(c: TestClient[Any, Any]) -> None:
        r = await c.get("/readyz")
        body = await r.json()
        assert r.status == 200 and body["ready"] is True
        assert set(body["checks"]) == {"index", "progress"}
    _run(_state(pending=lambda: 0), go_ready)

    async def go_loading(c: TestClient[Any, Any]) -> None:
        r = await c.get("/readyz")
        body = await r.json()
        assert r.status == 503 and body["checks"]["index"] == {"ok": False, "detail": "loading"}
        assert body["checks"]["broker"]["ok"] is False
        r = await c.post("/v1/check?url=http://a/", data=b"<p>x</p>", headers=HTML)
        assert r.status == 503 and (await r.json())["error"] == "not-ready"
    _run(_state(dedup=None, broker=broker_down), go_loading)

    stalled = _state(SETTINGS.replace(stall_seconds=5), pending=lambda: 42)
    stalled.metrics.progress_at = time.monotonic() - 60

    async def go_stalled(c: TestClient[Any, Any]) -> None:
        r = await c.get("/readyz")
        body = await r.json()
        assert r.status == 503 and body["checks"]["progress"]["ok"] is False
        assert "42 records waiting" in body["checks"]["progress"]["detail"]
    _run(stalled, go_stalled)

    idle = _state(SETTINGS.replace(stall_seconds=5), pending=lambda: 0)
    idle.metrics.progress_at = time.monotonic() - 60  # nothing to do is not a stall

    async def go_idle(c: TestClient[Any, Any]) -> None:
        assert (await c.get("/readyz")).status == 200
    _run(idle, go_idle)


# --- /v1/check -----------------------------------------------------------------------------
def test_check_html_gives_the_decision_without_inserting() -> None:
    state = _state()
    pages = _seeded(state)
    assert state.dedup is not None
    held = len(state.dedup.index)
    near = next(p for p, s in zip(pages, build(seed=3), strict=True) if s.expected[1] == "near")
    expected = state.dedup.would_decide(near)

    async def go(c: TestClient[Any, Any]) -> None:
        r = await c.post("/v1/check", params={"url": near.url}, data=near.body, headers=HTML)
        body = await r.json()
        assert r.status == 200 and body["inserted"] is False
        d = body["decision"]
        assert d == json.loads(expected.to_json())
        assert (d["decision"], d["reason"], d["verified"]) == ("drop", "near", True)
        assert d["duplicate_of"]["url"] and d["resemblance"] > 0.8 and d["shared_features"] >= 2
        new = "<html><body><p>" + " ".join(f"fresh{i}" for i in range(200)) + "</p></body></html>"
        for _ in range(2):  # not inserted: the same new page is "unique" every time
            r = await c.post("/v1/check?url=http://new/", data=new, headers=HTML)
            d = (await r.json())["decision"]
            assert (d["decision"], d["reason"], d["page_id"]) == ("keep", "unique", None)
    _run(state, go)
    assert len(state.dedup.index) == held
    assert state.dedup.snapshot()["pages"] == len(pages)


def test_check_json_page_object() -> None:
    state = _state()
    first, reordered = reordered_pair()
    assert state.dedup is not None
    state.dedup.check_html("http://r/1", first)

    async def go(c: TestClient[Any, Any]) -> None:
        r = await c.post("/v1/check", json={"url": "http://r/2", "html": reordered})
        d = (await r.json())["decision"]
        assert (d["decision"], d["reason"]) == ("keep", "verified-distinct")
        assert d["resemblance"] > 0.9 and d["ld_estimate"] > 1000  # the scores behind it
        r = await c.post("/v1/check", json={"url": "http://r/3", "html": first})
        d = (await r.json())["decision"]
        assert (d["reason"], d["duplicate_of"]) == ("exact", {"page_id": "0", "url": "http://r/1"})
    _run(state, go)


@pytest.mark.parametrize(("body", "content_type", "query", "status", "kind"), [
    (b"{not json", "application/json", "", 400, "bad-json"),
    (b'["a list"]', "application/json", "", 400, "bad-json"),
    (b'{"html": "<p>no url</p>"}', "application/json", "", 400, "no-url"),
    (b'{"url": "http://a/"}', "application/json", "", 400, "no-body"),
    (b'{"url": "http://a/", "body_b64": "%%%"}', "application/json", "", 400, "bad-base64"),
    (b"<p>html</p>", "text/html", "", 400, "no-url"),
    (b"<p>html</p>", "text/html", "?url=", 400, "no-url"),
    (b"", "text/html", "?url=http://a/", 400, "no-body"),
    (b"<p>html</p>", "text/plain", "?url=http://a/", 415, "unsupported-media-type"),
    (b"<p>html</p>", None, "?url=http://a/", 415, "unsupported-media-type"),
])
def test_check_bad_requests(body: bytes, content_type: str | None, query: str, status: int,
                            kind: str) -> None:
    async def go(c: TestClient[Any, Any]) -> None:
        headers = {"Content-Type": content_type} if content_type else {}
        r = await c.post("/v1/check" + query, data=body, headers=headers,
                         skip_auto_headers=["Content-Type"])
        assert r.status == status
        assert r.headers["Content-Type"].startswith("application/json")
        err = await r.json()
        assert err["error"] == kind and err["message"]
    _run(_state(), go)


def test_check_too_large() -> None:
    settings = Settings(max_page_bytes=3000)
    limit = max_request_bytes(settings)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: caught while reading
        for _ in range(limit // 1000 + 2):
            yield b"x" * 1000

    async def go(c: TestClient[Any, Any]) -> None:
        r = await c.post("/v1/check?url=http://a/", data=b"x" * (limit + 1), headers=HTML)
        err = await r.json()
        assert r.status == 413 and err["error"] == "too-large" and str(limit) in err["message"]
        r = await c.post("/v1/check?url=http://a/", data=chunks(), headers=HTML)
        assert r.status == 413 and (await r.json())["error"] == "too-large"
        # within the request limit, over max_page_bytes: the reject decision it would get
        r = await c.post("/v1/check?url=http://a/", data=b"<p>" + b"y " * 2000, headers=HTML)
        d = (await r.json())["decision"]
        assert r.status == 200 and (d["decision"], d["reason"]) == ("reject", "too-large")
    _run(_state(settings), go)


def test_routes_and_methods() -> None:
    async def go(c: TestClient[Any, Any]) -> None:
        for path in ("/v1/check", "/v1/forget"):
            r = await c.get(path)
            assert r.status == 405 and (await r.json())["error"] == "method-not-allowed"
            assert "POST" in r.headers["Allow"]
        r = await c.get("/nope")
        assert r.status == 404 and (await r.json())["error"] == "not-found"
    _run(_state(), go)


# --- the bearer token ------------------------------------------------------------------------
def test_token_guards_v1_but_not_health_or_metrics() -> None:
    state = _state(SETTINGS.replace(http_token="s3cret"))

    async def go(c: TestClient[Any, Any]) -> None:
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await c.get(path)).status == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"},
                        {"Authorization": "Basic s3cret"}):
            r = await c.get("/v1/stats", headers=headers)
            assert r.status == 401 and (await r.json())["error"] == "unauthorized"
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            r = await c.post("/v1/check?url=http://a/", data=b"<p>x</p>",
                             headers={**HTML, **headers})
            assert r.status == 401
            r = await c.post("/v1/forget", json={"all": True}, headers=headers)
            assert r.status == 401  # the token is checked first (tests/test_forget_doors.py)
        ok = {"Authorization": "Bearer s3cret"}
        assert (await c.get("/v1/stats", headers=ok)).status == 200
        r = await c.post("/v1/check?url=http://a/", data=b"<p>x</p>", headers={**HTML, **ok})
        assert r.status == 200
    _run(state, go)


# --- /v1/stats -------------------------------------------------------------------------------
def test_stats_summary() -> None:
    state = _state(extra_stats=lambda: {"kafka": {"consumer_lag_total": 0}})
    pages = _seeded(state)

    async def go(c: TestClient[Any, Any]) -> None:
        r = await c.get("/v1/stats")
        body = await r.json()
        assert r.status == 200
        assert body["pages"] == len(pages) == sum(body["decisions"].values())
        assert body["decisions"]["drop/near"] == body["verification"]["confirmed"] == 8
        assert body["near_precision_estimate"] == 1.0
        assert body["index_pages"] == body["decisions"]["keep/unique"]
        assert body["index"]["pages"] > 0 and body["params"]["groups"] == 6
        assert body["kafka"] == {"consumer_lag_total": 0}
    _run(state, go)


# --- the threaded server of `replay --http-port` ---------------------------------------------
def test_background_server_serves_and_reports_a_busy_port() -> None:
    port = free_port()
    state = _state()
    _seeded(state)
    with BackgroundServer(build_app(state), "127.0.0.1", port):
        assert get_json(f"http://127.0.0.1:{port}/v1/stats")["pages"] == 68
        status, body = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and b"stream_dedup_pages_total" in body
        with pytest.raises(OSError), BackgroundServer(build_app(_state()), "127.0.0.1", port):
            pass
    with pytest.raises(OSError):  # closed
        get(f"http://127.0.0.1:{port}/healthz")
    with BackgroundServer(build_app(state), "127.0.0.1", 0) as chosen:  # any free port
        assert chosen.port != 0
        assert get_json(f"http://127.0.0.1:{chosen.port}/v1/stats")["pages"] == 68


@pytest.mark.parametrize("size", [20_000, 100_000])
def test_an_oversized_header_line_is_one_log_line_and_counted(
        size: int, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    state = _state()
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    with BackgroundServer(build_app(state), "127.0.0.1", port):
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size
                          + b"\r\n\r\n")
                assert s.recv(64).startswith(b"HTTP/1.0 400 ")
        assert get_json(f"http://127.0.0.1:{port}/healthz") == {"status": "ok"}
    server = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert [(r.levelno, r.exc_info, r.getMessage().count("\n")) for r in server] == [
        (logging.INFO, None, 0)] * 3
    assert "bad request (LineTooLong: " in server[0].getMessage()
    assert len(server[0].getMessage()) < 400
    exposition = state.metrics.exposition()[0].decode()
    assert samples(exposition, "stream_dedup_http_bad_requests_total") == {"": 3.0}


def test_uploads_cut_short_by_the_client_are_counted_not_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    state = _state()
    caplog.set_level(logging.INFO, logger="aiohttp")
    with BackgroundServer(build_app(state), "127.0.0.1", port):
        for _ in range(20):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: "
                          b"application/json\r\nContent-Length: 100\r\n\r\nabc")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and samples(
                state.metrics.exposition()[0].decode(),
                "stream_dedup_http_bad_requests_total") != {"": 20.0}:
            time.sleep(0.05)
        assert get_json(f"http://127.0.0.1:{port}/healthz") == {"status": "ok"}
    assert [r.getMessage() for r in caplog.records if r.name.startswith("aiohttp")] == []
    exposition = state.metrics.exposition()[0].decode()
    assert samples(exposition, "stream_dedup_http_bad_requests_total") == {"": 20.0}


def test_replay_with_http_port(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stream_dedup.cli.sample import write_sample

    warc, jsonl, pages = write_sample(tmp_path / "crawl")
    out = tmp_path / "d.jsonl"
    port = free_port()
    assert main(["replay", str(warc), str(jsonl), "-o", str(out), "-q",
                 "--http-port", str(port)]) == 0
    assert f"HTTP API on http://127.0.0.1:{port}" in capsys.readouterr().err
    # the pages, the WARC's revisit record, the line that is not JSON
    assert len(out.read_text().splitlines()) == len(pages) + 2


def test_readyz_asks_a_shared_index_whether_every_primary_answers(redis_url: str) -> None:
    import redis as redis_py
    from indexkit import flush_redis

    flush_redis(redis_url)
    state = _state(Settings(index="redis", redis_url=redis_url))

    async def go(c: TestClient[Any, Any]) -> None:
        r = await c.get("/readyz")
        body = await r.json()
        assert r.status == 200, body
        assert "every Redis primary answers" in json.dumps(body)
        assert state.dedup is not None
        state.dedup.index.client = redis_py.Redis(port=free_port(),  # type: ignore[attr-defined]
                                                  socket_connect_timeout=0.5)
        r = await c.get("/readyz")
        body = await r.json()
        assert r.status == 503 and "a Redis primary does not answer" in json.dumps(body)
    _run(state, go)
