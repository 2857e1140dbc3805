"""A client of a running service's `POST /v1/check`, for callers in an asyncio event loop
(the Scrapy middleware, stream_dedup/scrapy.py).

A page goes as a JSON page object (the input topic's schema: `url`, `body_b64`, `headers`
as [name, value] pairs, `status`, `fetched_at`); the answer is the decision as a dict, the
same dict `Decision.to_dict()` gives in-process. Errors are translated here, once:

    the service refused the page (400, 413, 415: bad input)  -> a reject decision dict
    anything else (cannot connect, timeout, 401, 503, 5xx,   -> ServiceError(kind, message)
    an answer that is not the API's)

`/v1/check` answers the decision the page *would* get and does not store the page: the
service's index holds what it decided from its input topic.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pybase64

from stream_dedup.errors import ConfigError, StreamDedupError
from stream_dedup.models import Page

PAGE_REFUSED = frozenset({400, 413, 415})  # the page's fault: it gets a reject, not an error


class ServiceError(StreamDedupError):
    """The service could not give a decision: `kind` says why in a word (unreachable,
    timeout, unauthorized, not-ready, http-500, bad-answer)."""

    retriable = True

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def page_object(page: Page) -> bytes:
    """The JSON page object of `page`, as the input topic and /v1/check read it."""
    obj: dict[str, Any] = {"url": page.url, "body_b64": pybase64.b64encode(page.body).decode(),
                           "headers": [list(h) for h in page.headers]}
    if page.status is not None:
        obj["status"] = page.status
    if page.fetched_at is not None:
        obj["fetched_at"] = page.fetched_at
    return orjson.dumps(obj)


class CheckClient:
    """`await client.check(page)` -> the decision dict. One connection pool, made in the
    running loop at the first check; `await client.close()` at the end."""

    def __init__(self, base_url: str, token: str = "", timeout_s: float = 10.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"the service's URL must start with http:// or https://, "
                             f"got {base_url!r}")
        self.endpoint = base_url.rstrip("/") + "/v1/check"
        self.headers = {"Content-Type": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def check(self, page: Page) -> dict[str, Any]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self._session.post(self.endpoint, data=page_object(page),
                                          headers=self.headers) as resp:
                status, body = resp.status, await resp.read()
        except TimeoutError:
            raise ServiceError("timeout", f"no answer from {self.endpoint} within "
                               f"{self.timeout.total} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise ServiceError("unreachable", f"{self.endpoint}: {exc or type(exc).__name__}"
                               ) from None
        return _answer(self.endpoint, page, status, body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            # aiohttp closes its connections on the next loop turn
            await asyncio.sleep(0)
            self._session = None


def _answer(endpoint: str, page: Page, status: int, body: bytes) -> dict[str, Any]:
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise ServiceError("bad-answer" if status == 200 else f"http-{status}",
                           f"{endpoint} answered {status} with {body[:120]!r}: "
                           "not the stream-dedup API")
    if status == 200:
        decision = answer.get("decision")
        if not isinstance(decision, dict) or "decision" not in decision:
            raise ServiceError("bad-answer", f"{endpoint} answered 200 without a decision")
        return decision
    kind, message = str(answer.get("error", "")), str(answer.get("message", ""))
    if status in PAGE_REFUSED:
        return {"url": page.url, "decision": "reject", "reason": kind or f"http-{status}",
                "error": message}
    named = {401: "unauthorized", 503: "not-ready"}.get(status, f"http-{status}")
    raise ServiceError(named, f"{endpoint} answered {status}: {message or kind}")
