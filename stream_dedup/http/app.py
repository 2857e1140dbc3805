"""The HTTP API (aiohttp): what `serve` (and `replay --http-port`) answer on.

    GET  /metrics     Prometheus text exposition                     open
    GET  /healthz     the process answers                            open
    GET  /readyz      broker reachable, index answering, not stalled open (503 when not ready)
    POST /v1/check    the decision a page *would* get; not inserted  bearer token if configured
    GET  /v1/stats    a JSON summary                                 bearer token if configured
    POST /v1/forget   forget held pages (a namespace's, by url,      bearer token, which must
                      host, before or all); it changes the index     be configured (else 403)

Errors are JSON, `{"error": kind, "message": ...}`, with a 4xx status that says whose fault
it is (400 bad input, 401 token missing or wrong, 403 a change this service does not allow,
404/405 route, 413 too large, 415 content type, 503 not ready). Everything the handlers need
is one `ApiState` under a typed AppKey; the owner (service or replay) fills it in.
`/v1/check` runs `Deduplicator.would_decide` in a thread, `/v1/forget` `Deduplicator.forget`:
the Deduplicator's lock orders each with the batch being decided.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from stream_dedup.config import Settings
from stream_dedup.core.canonical import kernels
from stream_dedup.errors import IndexUnavailable, PageError
from stream_dedup.index.namespaces import SELECTORS, Forget, NamespaceError, check_name, selector
from stream_dedup.metrics import Metrics
from stream_dedup.models import Page
from stream_dedup.sources.jsonl import page_from_json
from stream_dedup.version import __version__

if TYPE_CHECKING:
    from stream_dedup.pipeline.deduplicator import Deduplicator

HTML_TYPES = ("text/html", "application/xhtml+xml")


@dataclass(frozen=True, slots=True)
class Check:
    ok: bool
    detail: str


class ApiState:
    """What the handlers read. `dedup` is None while the index loads; `broker` probes the
    Kafka cluster (None: no broker, as in replay); `index_problem` says why the index cannot
    answer now ("" when it can); `pending` says how many input records wait (None: unknown,
    counted as waiting); `extra_stats` adds a section to /v1/stats."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        dedup: Deduplicator | None = None,
        *,
        broker: Callable[[], Awaitable[Check]] | None = None,
        index_problem: Callable[[], str] = lambda: "",
        pending: Callable[[], int | None] = lambda: None,
        extra_stats: Callable[[], dict[str, Any]] | None = None,
        journal: Callable[[list[int]], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.dedup = dedup
        self.broker = broker
        self.index_problem = index_problem
        self.pending = pending
        self.extra_stats = extra_stats
        # Writes a forget's page ids where a restored index reads them (the changelog,
        # exactly-once), acknowledged, before /v1/forget answers; None: nothing to write
        self.journal = journal
        self.started = time.time()

    async def readiness(self) -> dict[str, Check]:
        checks: dict[str, Check] = {}
        if self.broker is not None:
            checks["broker"] = await self.broker()
        checks["index"] = await self._index()
        idle = time.monotonic() - self.metrics.progress_at
        pending = self.pending()
        stalled = pending != 0 and idle > self.settings.stall_seconds
        waiting = "unknown" if pending is None else str(pending)
        checks["progress"] = Check(not stalled, f"last batch {idle:.0f} s ago; "
                                   f"{waiting} records waiting")
        return checks


    async def _index(self) -> Check:
        """Loaded, and able to answer: the runner's word (its last batch), and for a shared
        index, every primary answering a PING now."""
        if self.dedup is None:
            return Check(False, "loading")
        problem = self.index_problem()
        if problem:
            return Check(False, f"unavailable: {problem}")
        ping = getattr(self.dedup.index, "ping", None)
        if ping is None:
            return Check(True, "loaded")
        try:
            answers = await asyncio.wait_for(asyncio.to_thread(ping), PING_TIMEOUT_S)
        except TimeoutError:
            answers = False
        return (Check(True, "every Redis primary answers") if answers
                else Check(False, "a Redis primary does not answer"))


PING_TIMEOUT_S = 2.0
STATE = web.AppKey("state", ApiState)


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message
        self.headers = dict(headers or {})


def max_request_bytes(settings: Settings) -> int:
    """The largest accepted request: the largest page, base64-encoded, plus its JSON."""
    return settings.max_page_bytes * 4 // 3 + 64 * 1024


def build_app(state: ApiState) -> web.Application:
    app = web.Application(client_max_size=max_request_bytes(state.settings),
                          middlewares=[_errors, _auth])
    app[STATE] = state
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_post("/v1/check", _check)
    app.router.add_get("/v1/stats", _stats)
    app.router.add_post("/v1/forget", _forget)
    return app


def app_runner(app: web.Application) -> web.AppRunner:
    """The runner that serves `app` (built by `build_app`): no access log, and a request
    aiohttp cannot parse is one log line and a count, not an error with a traceback."""
    return web.AppRunner(app, access_log=None, logger=_ServerLog(app[STATE].metrics))


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server logger, except for requests its parser rejects with a 400 (a header
    line over 8 KB, a bad request line, ...): anyone who can connect can send those, as
    often as they like, and aiohttp logs each at ERROR with a traceback. Here each is counted
    (stream_dedup_http_bad_requests_total) and told in one line, at INFO at most."""

    def __init__(self, metrics: Metrics) -> None:
        super().__init__(logging.getLogger("aiohttp.server"))
        self.metrics = metrics

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, ConnectionError):  # the client went away mid-request
            self.metrics.http_bad_requests.inc()
            self.logger.debug("client disconnected mid-request (%s)", type(exc).__name__)
            return
        if not isinstance(exc, HttpProcessingError):
            super().log(level, msg, *args, **kwargs)
            return
        self.metrics.http_bad_requests.inc()
        told = str(msg) % args if args else str(msg)
        self.logger.log(min(level, logging.INFO), "%s: bad request (%s: %.200r)", told,
                        type(exc).__name__, exc.message)


# --- middlewares ---------------------------------------------------------------------------
_STATUS_KINDS = {404: "not-found", 405: "method-not-allowed", 413: "too-large"}
log = logging.getLogger("stream_dedup.http")


def _error(status: int, kind: str, message: str,
           headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": kind, "message": message}, status=status,
                             headers=headers)


@web.middleware
async def _errors(request: web.Request,
                  handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as err:
        return _error(err.status, err.kind, err.message, err.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        keep = {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate")}
        return _error(exc.status, _STATUS_KINDS.get(exc.status, "http-error"),
                      exc.text or exc.reason, keep)


@web.middleware
async def _auth(request: web.Request,
                handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                ) -> web.StreamResponse:
    token = request.app[STATE].settings.http_token
    if token and request.path.startswith("/v1/"):
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), token.encode()):
            raise ApiError(401, "unauthorized", "this endpoint needs 'Authorization: Bearer "
                           "<token>' with the service's token (STREAM_DEDUP_HTTP_TOKEN)",
                           {"WWW-Authenticate": 'Bearer realm="stream-dedup"'})
    return await handler(request)


# --- handlers ------------------------------------------------------------------------------
async def _metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[STATE].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": content_type})


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    checks = await request.app[STATE].readiness()
    ready = all(c.ok for c in checks.values())
    body = {"ready": ready,
            "checks": {name: {"ok": c.ok, "detail": c.detail} for name, c in checks.items()}}
    return web.json_response(body, status=200 if ready else 503)


async def _check(request: web.Request) -> web.Response:
    state = request.app[STATE]
    dedup = _loaded(state)
    page = await _page(request, state.settings)
    decision = await asyncio.to_thread(dedup.would_decide, page)
    return web.json_response({"decision": decision.to_dict(), "inserted": False})


async def _stats(request: web.Request) -> web.Response:
    state = request.app[STATE]
    dedup = _loaded(state)
    s, metrics = state.settings, state.metrics
    body: dict[str, Any] = {
        "version": __version__,
        "kernels": kernels(),
        "uptime_seconds": round(time.time() - state.started, 3),
        **await asyncio.to_thread(dedup.snapshot),
        "near_precision_estimate": metrics.precision_estimate(),
        "verify_rate": s.verify_rate,
        "index": metrics.index_stats,
        "seconds_since_progress": round(time.monotonic() - metrics.progress_at, 3),
        "params": {"shingle_words": s.shingle_words, "groups": s.groups,
                   "group_size": s.group_size, "threshold": s.threshold,
                   "stamp": f"{s.params.stamp:#x}"},
    }
    if state.extra_stats is not None:
        body.update(state.extra_stats())
    return web.json_response(body)


async def _forget(request: web.Request) -> web.Response:
    """Forget the held pages a selector chooses. It changes the index, so it needs a token:
    a service without one refuses (403); one with a token has checked it already (_auth)."""
    state = request.app[STATE]
    if not state.settings.http_token:
        raise ApiError(403, "forbidden", "POST /v1/forget changes the index: it is allowed "
                       "only on a service with an HTTP token (STREAM_DEDUP_HTTP_TOKEN or the "
                       "config file's http_token), sent as 'Authorization: Bearer <token>'")
    dedup = _loaded(state)
    words, what = _forget_words(await request.read(), state.settings.namespace)
    started = time.perf_counter()
    try:
        gone = await asyncio.to_thread(dedup.forget, what)
    except IndexUnavailable as err:
        raise ApiError(503, "index-unavailable", f"nothing was forgotten: {err}") from None
    if state.journal is not None and gone:
        try:
            await state.journal(gone)
        except Exception as err:  # noqa: BLE001 (a broker's error, whatever its kind)
            raise ApiError(503, "not-journaled", f"{len(gone)} page(s) forgotten in this "
                           f"index, not yet in its changelog ({err}): they go there with the "
                           "next batch; until then a restore would bring them back") from None
    seconds = time.perf_counter() - started
    log.info("POST /v1/forget from %s: forgot %d page(s), %s", request.remote, len(gone),
             what.describe())
    return web.json_response({"forgotten": len(gone), "namespace": what.namespace,
                              "selector": words, "seconds": round(seconds, 3)})


def _forget_words(body: bytes, namespace: str) -> tuple[dict[str, Any], Forget]:
    """The selector of a /v1/forget request, as given and as a Forget: a JSON object of one
    of url, host, before (strings) or all (true), and a namespace (default: the service's)."""
    try:
        words = json.loads(body) if body.strip() else None
    except ValueError:
        words = None
    if not isinstance(words, dict):
        raise ApiError(400, "bad-json", 'send a JSON object, e.g. {"namespace": "a", '
                       '"host": "example.com"}: one of url, host, before (ISO 8601), '
                       'all (true), and optionally namespace')
    unknown = sorted(set(words) - {"namespace", *SELECTORS})
    wrong = [name for name, v in words.items() if name not in unknown and not (
        isinstance(v, bool) if name == "all" else isinstance(v, str))]
    if unknown or wrong:
        raise ApiError(400, "bad-selector", f"unknown field(s) {', '.join(unknown)}: the "
                       "fields are url, host, before, all and namespace" if unknown else
                       f"{', '.join(wrong)}: all is true or false, the others are strings")
    try:
        if "namespace" in words:  # given, even empty: it must name a namespace
            namespace = check_name(words["namespace"], "namespace")
        chosen = {k: v for k, v in words.items() if k in SELECTORS and v is not False}
        return chosen, selector(namespace=namespace, **chosen)
    except NamespaceError as err:
        raise ApiError(400, "bad-selector", str(err)) from None


def _loaded(state: ApiState) -> Deduplicator:
    if state.dedup is None:
        raise ApiError(503, "not-ready", "the index is still loading")
    return state.dedup


async def _page(request: web.Request, settings: Settings) -> Page:
    """The page of a /v1/check request: a JSON page object, or HTML with ?url=."""
    limit = max_request_bytes(settings)
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, "too-large", f"request body of {request.content_length} bytes; "
                       f"the limit is {limit} (max_page_bytes={settings.max_page_bytes})")
    kind = request.content_type
    if kind != "application/json" and kind not in HTML_TYPES:
        raise ApiError(415, "unsupported-media-type", f"Content-Type {kind!r}: send "
                       "application/json (a page object, as on the input topic) or text/html "
                       "with ?url=<the page's URL>")
    body = await request.read()  # over client_max_size: HTTPRequestEntityTooLarge (413)
    if not body:
        raise ApiError(400, "no-body", "the request body is empty")
    if kind == "application/json":
        try:
            return page_from_json(body)
        except PageError as err:
            raise ApiError(400, err.kind, err.message) from None
    url = request.query.get("url", "").strip()
    if not url:
        raise ApiError(400, "no-url", "HTML needs the page's URL: POST /v1/check?url=<url>")
    return Page(url=url, body=body, headers=(("Content-Type", request.headers["Content-Type"]),))
