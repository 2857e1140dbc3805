"""Scrapy integration: a downloader middleware that decides every HTML response before the
spider parses it (`pip install 'stream-dedup[scrapy]'`; only this module imports Scrapy).

    DOWNLOADER_MIDDLEWARES = {"stream_dedup.scrapy.DedupMiddleware": 540}

Where it sits: responses pass the downloader middlewares from the highest number down, so
at 540 a response has been decompressed (HttpCompressionMiddleware, 590), redirected
(RedirectMiddleware, 600; MetaRefreshMiddleware, 580) and retried (RetryMiddleware, 550):
the page decided is the body the spider would get. At 950 it would be the compressed bytes.

For each response with a status in STREAM_DEDUP_STATUSES and an HTML Content-Type (or none,
when Scrapy sniffed HTML), unless its request's meta has "stream_dedup_skip" (pages whose
links must be followed whatever they copy: listings, pagination, sitemaps in HTML):
    keep   -> passed on; `response.meta["stream_dedup"]` is the decision (a dict, the JSON
              of a decision as `replay` writes it)
    drop   -> `DuplicatePage` (an IgnoreRequest): the spider never sees it, so its links are
              not followed; the request's errback, if any, gets the decision
    reject -> passed on (the page could not be decided: too large, undecodable...), with the
              reject decision in meta
Every outcome is counted in the crawl's stats: stream_dedup/keep/<reason>,
stream_dedup/drop/<reason>, stream_dedup/reject/<kind>, stream_dedup/skipped/<why>,
stream_dedup/error/<kind>; and stream_dedup/check_seconds, the time the checks took (for
the service: from sending the page to its answer).

Who decides: the library in this process (the default: `Deduplicator`, Settings from
STREAM_DEDUP_CONFIG, the STREAM_DEDUP_* environment and STREAM_DEDUP_SETTINGS), or a running
`serve` over `POST /v1/check` when STREAM_DEDUP_URL is set (http/client.py; needs Scrapy's
asyncio reactor, its default since 2.13). In-process, a page is decided in the reactor's
thread, as a spider callback parses one: it takes about as long as parsing it (bench/
scrapy_crawl.py), and decisions are made in the order responses arrive, which is the order
the index sees them. A thread would only add a hand-off: deciding holds one lock.

When the service cannot answer (or the local index, e.g. a Redis one), or the library
raises anything else (a bug: counted as stream_dedup/error/internal-error, logged with its
traceback, as the Kafka runner turns it into an `internal-error` reject): STREAM_DEDUP_ON_ERROR
= "keep" (fail open, the default: the spider gets the page, undeduplicated; a crawl should
not lose pages because its filter is down) or "drop" (fail closed). Each is counted and
logged with the page's URL: the first error at ERROR, then one line at most every 30 s with
the count.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import HtmlResponse, Request, Response

from stream_dedup.config import Settings
from stream_dedup.errors import ConfigError, StreamDedupError
from stream_dedup.http.client import CheckClient, ServiceError
from stream_dedup.models import Page
from stream_dedup.sources.http_response import is_html

log = logging.getLogger("stream_dedup.scrapy")

META_KEY = "stream_dedup"
SKIP_KEY = "stream_dedup_skip"  # a request whose response is never decided (a hub page)
ON_ERROR = ("keep", "drop")
ERROR_LOG_EVERY_S = 30.0


def _asyncio_available() -> bool:
    """Whether coroutines here may await asyncio (aiohttp): Scrapy's asyncio reactor."""
    try:
        from scrapy.utils.asyncio import (  # type: ignore[import-not-found,unused-ignore]
            is_asyncio_available,  # newer than 2.13
        )
    except ImportError:
        from scrapy.utils.reactor import is_asyncio_reactor_installed

        return is_asyncio_reactor_installed()
    return bool(is_asyncio_available())


class DuplicatePage(IgnoreRequest):
    """A response dropped as a duplicate; `decision` says of what."""

    def __init__(self, decision: dict[str, Any]) -> None:
        super().__init__(f"stream-dedup: drop {decision.get('reason')} "
                         f"(duplicate of {(decision.get('duplicate_of') or {}).get('url')})")
        self.decision = decision


class Checker(Protocol):
    async def check(self, page: Page) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class LocalChecker:
    """The library in this process: the same Deduplicator replay and serve use."""

    def __init__(self, settings: Settings) -> None:
        from stream_dedup.pipeline.deduplicator import Deduplicator
        from stream_dedup.workers.table_cache import load_tables

        load_tables()
        self.dedup = Deduplicator(settings)

    async def check(self, page: Page) -> dict[str, Any]:
        return self.dedup.check(page).to_dict()

    async def close(self) -> None:
        self.dedup.close()


class DedupMiddleware:
    """The downloader middleware (see the module's docstring)."""

    def __init__(self, checker: Checker, stats: Any, *, statuses: frozenset[int],
                 on_error: str) -> None:
        if on_error not in ON_ERROR:
            raise ConfigError(f"STREAM_DEDUP_ON_ERROR must be keep or drop, got {on_error!r}")
        self.checker = checker
        self.stats = stats
        self.statuses = statuses
        self.on_error = on_error
        self.errors = 0
        self._errors_told = 0
        self._told_at = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DedupMiddleware:
        s = crawler.settings
        on_error = (s.get("STREAM_DEDUP_ON_ERROR") or "keep").lower()
        try:
            statuses = frozenset(int(x) for x in s.getlist("STREAM_DEDUP_STATUSES", [200, 203]))
        except ValueError:
            raise ConfigError("STREAM_DEDUP_STATUSES must be HTTP status codes, got "
                              f"{s.get('STREAM_DEDUP_STATUSES')!r}") from None
        if on_error not in ON_ERROR:  # before an index is opened
            raise ConfigError(f"STREAM_DEDUP_ON_ERROR must be keep or drop, got {on_error!r}")
        url = s.get("STREAM_DEDUP_URL") or ""
        checker: Checker
        if url:
            if not _asyncio_available():
                raise ConfigError(
                    "STREAM_DEDUP_URL needs Scrapy's asyncio reactor: TWISTED_REACTOR = "
                    "'twisted.internet.asyncioreactor.AsyncioSelectorReactor'")
            checker = CheckClient(url, s.get("STREAM_DEDUP_TOKEN") or "",
                                  s.getfloat("STREAM_DEDUP_TIMEOUT", 10.0))
            where = f"the service at {url} (POST /v1/check)"
        else:
            overrides = s.getdict("STREAM_DEDUP_SETTINGS")
            checker = LocalChecker(Settings.load(s.get("STREAM_DEDUP_CONFIG") or None,
                                                 overrides=overrides))
            where = "the library, in this process"
        mw = cls(checker, crawler.stats, statuses=statuses, on_error=on_error)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        log.info("stream-dedup decides HTML responses (status %s) with %s; on an error: %s",
                 ", ".join(map(str, sorted(statuses))), where, mw.on_error)
        return mw

    async def process_response(self, request: Request, response: Response,
                               spider: Any = None) -> Response:
        page = self._page(request, response)
        if page is None:
            return response
        started = time.perf_counter()
        try:
            decision = await self.checker.check(page)
        except Exception as exc:  # any, not only StreamDedupError: a bug must not lose the page
            return self._failed(request, response, exc)
        finally:
            self.stats.inc_value("stream_dedup/check_seconds", time.perf_counter() - started)
        kind, reason = decision["decision"], decision["reason"]
        self.stats.inc_value(f"stream_dedup/{kind}/{reason}")
        # response.meta is request.meta, once the engine ties the two (after this chain)
        request.meta[META_KEY] = decision
        if kind == "drop":
            raise DuplicatePage(decision)
        return response

    async def spider_closed(self) -> None:
        if self.errors:
            log.error("stream-dedup: %d page(s) could not be decided this crawl "
                      "(STREAM_DEDUP_ON_ERROR=%s)", self.errors, self.on_error)
        await self.checker.close()

    def _page(self, request: Request, response: Response) -> Page | None:
        """The page to decide, or None (counted under stream_dedup/skipped/)."""
        if request.meta.get(SKIP_KEY):
            self.stats.inc_value("stream_dedup/skipped/meta")
            return None
        if response.status not in self.statuses:
            self.stats.inc_value("stream_dedup/skipped/status")
            return None
        content_type = response.headers.get("Content-Type")
        ctype = content_type.decode("latin-1") if content_type is not None else None
        if not (is_html(ctype) or (ctype is None and isinstance(response, HtmlResponse))):
            self.stats.inc_value("stream_dedup/skipped/not-html")
            return None
        headers = tuple((name.decode("latin-1"), value.decode("latin-1"))
                        for name, values in response.headers.items() for value in values)
        if ctype is None:  # Scrapy sniffed it: say so, as a reader of archives would need
            headers += (("Content-Type", "text/html"),)
        return Page(url=response.url, body=response.body, headers=headers,
                    status=response.status)

    def _failed(self, request: Request, response: Response, exc: Exception) -> Response:
        if isinstance(exc, ServiceError):
            kind = exc.kind
        elif isinstance(exc, StreamDedupError):
            kind = type(exc).__name__
        else:  # not an error the library means to raise: a bug, as the Kafka runner names it
            kind = "internal-error"
        self.stats.inc_value(f"stream_dedup/error/{kind}")
        self.errors += 1
        now = time.monotonic()
        if self._errors_told == 0 or now - self._told_at >= ERROR_LOG_EVERY_S:
            log.error("stream-dedup could not decide %s (%s: %s); %d page(s) so far, each %s "
                      "(STREAM_DEDUP_ON_ERROR)", response.url, type(exc).__name__, exc,
                      self.errors, "passed to the spider undecided" if self.on_error == "keep"
                      else "dropped", exc_info=kind == "internal-error")
            self._errors_told, self._told_at = self.errors, now
        if self.on_error == "drop":
            raise IgnoreRequest(f"stream-dedup could not decide the page: {exc}")
        request.meta["stream_dedup_error"] = str(exc)
        return response
