"""The Scrapy middleware (stream_dedup/scrapy.py) in real crawls: a site served by aiohttp in
this process, crawled by a real Scrapy spider in a subprocess (tests/scrapykit.py), deciding
with the library in process, with a running `serve` over POST /v1/check, and with a service
that does not answer."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import scrapy  # noqa: F401  (the [scrapy] extra, in [dev] too: a missing one fails here)
from aiohttp import web
from aiohttp.test_utils import TestServer
from opskit import free_port, get, wait_for
from scrapykit import HTML_TYPE, Site, SiteServer, build_site
from test_operate import _produce

from stream_dedup import Deduplicator, Page, Settings
from stream_dedup.http import ApiState, build_app
from stream_dedup.http.client import CheckClient, ServiceError
from stream_dedup.metrics import Metrics

REPO = Path(__file__).resolve().parents[1]
KIT = Path(__file__).with_name("scrapykit.py")
HTML = (("Content-Type", HTML_TYPE),)


def _readme_settings() -> dict[str, str]:
    """The settings of the README's Scrapy snippet, as written (every crawl here uses them),
    each as JSON for `-s NAME=VALUE`."""
    text = (REPO / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S)
                 if "stream_dedup.scrapy" in b)
    names: dict[str, Any] = {}
    exec(block, {}, names)
    assert "DOWNLOADER_MIDDLEWARES" in names
    return {k: json.dumps(v) for k, v in names.items() if k.isupper()}


def _crawl(start: str, out: Path, **settings: str) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """Crawl from `start` with the README's settings and `settings`; the crawl's stats and
    the parsed pages."""
    args = [sys.executable, str(KIT), start, str(out)]
    for name, value in {**_readme_settings(), **settings}.items():
        args += ["-s", f"{name}={value}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env,
                          cwd=out)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Traceback" not in done.stderr, done.stderr[-4000:]
    assert "[py.warnings]" not in done.stderr, done.stderr[-4000:]  # e.g. a deprecation
    stats = json.loads((out / "stats.json").read_text())
    pages = [json.loads(line) for line in (out / "pages.jsonl").read_text().splitlines()]
    return stats, pages


def _decided(site: Site, server: SiteServer) -> list[Page]:
    """The pages the middleware decided, in the order they were fetched: the HTML answers
    with status 200 (bodies as sent before any gzip; the spider got them inflated)."""
    out = []
    for path, _ in server.log:
        res = site.resources.get(path)
        if res is None or res.status != 200 or res.content_type != HTML_TYPE:
            continue
        out.append(Page(server.url + path, res.body, (("Content-Type", res.content_type),),
                        status=200))
    return out


def _dedup_stats(stats: dict[str, int]) -> Counter[tuple[str, str]]:
    return Counter({tuple(k.split("/")[1:3]): v for k, v in stats.items()
                    if k.startswith(("stream_dedup/keep/", "stream_dedup/drop/",
                                     "stream_dedup/reject/"))})


def _links_not_followed(site: Site, server: SiteServer, decisions: list[dict[str, Any]]
                        ) -> None:
    """No request came from a dropped page (Scrapy sends the Referer of the page a link was
    found on), and the pages only dropped pages link to were never fetched. (A URL fetched
    twice, kept once, is left out: "/", a start URL, is fetched again and `unchanged`.)"""
    kept = {d["url"] for d in decisions if d["decision"] != "drop"}
    dropped = {d["url"] for d in decisions if d["decision"] == "drop"} - kept
    assert dropped
    fetched = [path for path, _ in server.log]
    from_dropped = [(p, ref) for p, ref in server.log if server.url + ref in dropped]
    assert not from_dropped, f"links of dropped pages were followed: {from_dropped}"
    for path in site.only_from_duplicates:
        linked_from = [p for p in dropped if path.encode() in site.resources[
            p.removeprefix(server.url)].body]
        if linked_from:
            assert path not in fetched, f"{path} fetched though only {linked_from} links it"


def test_crawl_with_the_library_decides_as_replay(tmp_path: Path) -> None:
    site = build_site()
    with SiteServer(site.resources) as server:
        stats, parsed = _crawl(server.url + "/", tmp_path)
    pages = _decided(site, server)
    # The same pages, in the same order, through `stream-dedup replay` (the CLI, a JSONL input)
    lines = [json.dumps({"url": p.url, "body_b64": base64.b64encode(p.body).decode(),
                         "headers": [list(h) for h in p.headers], "status": p.status})
             for p in pages]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    subprocess.run([sys.executable, "-m", "stream_dedup", "replay", "in.jsonl", "-o",
                    "out.jsonl", "--quiet"], cwd=tmp_path, check=True, timeout=120,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    replayed = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(replayed) == len(pages) > 15

    assert _dedup_stats(stats) == Counter((d["decision"], d["reason"]) for d in replayed)
    by_url = {d["url"]: d for d in replayed}  # a URL fetched twice ("/"): its last decision
    # every copy on the site is dropped for what it is, against its original
    for path, reason in site.copies.items():
        d = by_url[server.url + path]
        assert (d["decision"], d["reason"]) == ("drop", reason), d
    assert stats["stream_dedup/skipped/not-html"] == 2  # the image and the JSON file
    assert stats["stream_dedup/skipped/status"] == 1  # the 404 (a 301 is followed first)
    assert stats["httpcompression/response_count"] == 1  # the gzip page, decided inflated

    # kept pages reach the spider with their decision (replay's, but for its `source`)
    html_parsed = [p for p in parsed if p["decision"] is not None]
    kept = [d for d in replayed if d["decision"] != "drop"]
    assert [p["url"] for p in html_parsed] == [d["url"] for d in kept]
    for got, want in zip(html_parsed, kept, strict=True):
        assert got["decision"] == {**want, "source": None}
    others = {p["url"].removeprefix(server.url) for p in parsed if p["decision"] is None}
    assert others == {"/logo.png", "/data.json"}

    assert {server.url + p for p in site.copies} <= {d["url"] for d in replayed
                                                     if d["decision"] == "drop"}
    _links_not_followed(site, server, replayed)


def test_requests_marked_to_skip_are_not_decided(tmp_path: Path) -> None:
    """meta["stream_dedup_skip"]: the copies are parsed, so the pages they link are fetched."""
    site = build_site()
    with SiteServer(site.resources) as server:
        stats, parsed = _crawl(server.url + "/", tmp_path, KIT_SKIP_PREFIX="/copies/")
    assert stats["stream_dedup/skipped/meta"] == len(site.copies) == 3
    assert not any(k.startswith("stream_dedup/drop/") and k != "stream_dedup/drop/unchanged"
                   for k in stats)
    got = {p["url"].removeprefix(server.url): p["decision"] for p in parsed}
    assert all(got[path] is None for path in site.copies)
    assert site.only_from_duplicates <= {path for path, _ in server.log}


def _mirrored(site: Site) -> list[tuple[bytes, bytes]]:
    """What the service holds before the crawl: the copies of articles 0, 1 and 2 (exact,
    canonical, near) under another host, as input-topic messages."""
    out = []
    for path in site.copies:
        url = "http://mirror.example" + path
        body = site.resources[path].body
        out.append((url.encode(), json.dumps({"url": url, "html": body.decode()}).encode()))
    return out


@pytest.fixture
def serving(kafka_bootstrap: str, tmp_path: Path, site: Site) -> Iterator[str]:
    """A real `serve` on the broker whose index holds `_mirrored(site)`; its HTTP API's URL."""
    tag = f"scrapy-{uuid.uuid4().hex[:10]}"
    messages = _mirrored(site)
    asyncio.run(_produce(kafka_bootstrap, f"{tag}-pages", messages))
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers",
             kafka_bootstrap, "--input-topic", f"{tag}-pages", "--decisions-topic",
             f"{tag}-decisions", "--dead-letter-topic", f"{tag}-dead", "--group-id",
             f"{tag}-group", "--http-port", str(port)], stdout=fh, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"

    def decided() -> bool:
        try:
            status, body = get(url + "/v1/stats")
        except OSError:
            return False
        return status == 200 and json.loads(body)["pages"] == len(messages)
    try:
        wait_for("the mirrored pages decided", decided, timeout=120)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


@pytest.fixture
def site() -> Site:
    return build_site()


@pytest.mark.kafka
def test_crawl_through_serve_asks_its_index(site: Site, serving: str, tmp_path: Path) -> None:
    with SiteServer(site.resources) as server:
        stats, parsed = _crawl(server.url + "/", tmp_path, STREAM_DEDUP_URL=serving)
    # What /v1/check answers: the decision against what the service holds, not stored
    local = Deduplicator()
    for _, value in _mirrored(site):
        obj = json.loads(value)
        local.check_html(obj["url"], obj["html"])
    pages = _decided(site, server)
    expected = [local.would_decide(p).to_dict() for p in pages]
    local.close()
    assert _dedup_stats(stats) == Counter((d["decision"], d["reason"]) for d in expected)
    reasons = {d["url"].removeprefix(server.url): d["reason"] for d in expected
               if d["decision"] == "drop"}
    # the originals are now the duplicates: of the service's copies
    assert reasons == {"/article/0": "exact", "/article/1": "canonical", "/article/2": "near"}
    html_parsed = [p for p in parsed if p["decision"] is not None]
    kept = [d for d in expected if d["decision"] != "drop"]
    assert [(p["url"], p["decision"]["decision"], p["decision"]["reason"],
             p["decision"]["duplicate_of"]) for p in html_parsed] == [
        (d["url"], d["decision"], d["reason"], d["duplicate_of"]) for d in kept]
    _links_not_followed(site, server, expected)
    fetched = {path for path, _ in server.log}
    assert "/copies/near" not in fetched and "/child/0" not in fetched


@pytest.mark.parametrize("on_error", ["keep", "drop"])
def test_a_service_that_does_not_answer(on_error: str, tmp_path: Path) -> None:
    """Nothing listens at STREAM_DEDUP_URL: every page is an error, counted; "keep" passes
    each to the spider undecided (the whole site is crawled), "drop" drops each (the crawl
    ends at its first page)."""
    site = build_site()
    with SiteServer(site.resources) as server:
        stats, parsed = _crawl(server.url + "/", tmp_path, STREAM_DEDUP_ON_ERROR=on_error,
                               STREAM_DEDUP_URL=f"http://127.0.0.1:{free_port()}",
                               STREAM_DEDUP_TIMEOUT="5")
    errors = stats.get("stream_dedup/error/unreachable", 0)
    assert not _dedup_stats(stats)
    if on_error == "drop":
        assert errors == 1 and parsed == [] and [p for p, _ in server.log] == ["/"]
        return
    assert errors == len(_decided(site, server)) > 15
    assert all(p["decision"] is None for p in parsed)
    assert all("unreachable" in p["error"] for p in parsed if p["url"].endswith(
        ("/", "/zipped", "/landed")))
    assert "/secret/near" in {p for p, _ in server.log}  # nothing was dropped


def test_the_core_never_imports_scrapy() -> None:
    """The core never imports Scrapy: only stream_dedup.scrapy does."""
    code = ("import sys, stream_dedup, stream_dedup.cli.main, stream_dedup.kafka.service, "
            "stream_dedup.http.client; assert 'scrapy' not in sys.modules, 'scrapy imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


# --- the client of /v1/check (stream_dedup/http/client.py) against the real API app -------
def test_the_client_translates_every_answer_of_the_service() -> None:
    settings = Settings(max_page_bytes=40_000, http_token="secret")
    dedup = Deduplicator(settings)
    site = build_site()
    article = site.resources["/article/0"].body
    dedup.check(Page("http://a/0", article, HTML))
    state = ApiState(settings, Metrics(settings), dedup)

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response(text="late")

    async def other(request: web.Request) -> web.Response:
        return web.Response(text="<html>not the API</html>", content_type="text/html")

    elsewhere = web.Application()
    elsewhere.router.add_post("/slow/v1/check", slow)
    elsewhere.router.add_post("/other/v1/check", other)

    async def go() -> None:
        async with TestServer(build_app(state)) as api, TestServer(elsewhere) as foreign:
            base = str(api.make_url("/"))
            client = CheckClient(base, token="secret")
            try:
                same = await client.check(Page("http://b/0", article, HTML))
                assert (same["decision"], same["reason"]) == ("drop", "exact")
                assert same["duplicate_of"]["url"] == "http://a/0"
                new = await client.check(Page("http://b/1", b"<p>" + b"new words " * 50, HTML))
                assert new["decision"] == "keep"
                # too large for the library (a reject decision) and for the request (413)
                for size in (60_000, 200_000):
                    big = await client.check(Page("http://b/2", b"<p>" + b"y" * size, HTML))
                    assert (big["decision"], big["reason"]) == ("reject", "too-large"), big
                state.dedup = None
                with pytest.raises(ServiceError) as err:
                    await client.check(Page("http://b/3", article, HTML))
                assert err.value.kind == "not-ready"
                state.dedup = dedup
            finally:
                await client.close()
            wrong = CheckClient(base, token="guess")
            with pytest.raises(ServiceError) as err:
                await wrong.check(Page("http://b/4", article, HTML))
            await wrong.close()
            assert err.value.kind == "unauthorized"
            for path, kind, timeout in (("slow", "timeout", 0.3), ("other", "bad-answer", 5)):
                client = CheckClient(str(foreign.make_url(f"/{path}")), timeout_s=timeout)
                with pytest.raises(ServiceError) as err:
                    await client.check(Page("http://b/5", article, HTML))
                await client.close()
                assert err.value.kind == kind, err.value
    asyncio.run(go())
    dedup.close()


# --- failing open on any error of the library (the middleware driven directly) -------------
@pytest.mark.parametrize("exc", [RuntimeError("a bug in the index"), KeyError(7),
                                 ValueError("decide_batch needs a sketched Analysis")])
def test_any_error_of_the_library_fails_open(exc: Exception,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Not only a StreamDedupError: whatever the library in process raises (here its index,
    as a bug would), the page reaches the spider (STREAM_DEDUP_ON_ERROR=keep), counted and
    logged with its URL; with "drop" it is ignored. Never an exception Scrapy would take
    for the download failing, losing the page."""
    from scrapy.exceptions import IgnoreRequest
    from scrapy.http import HtmlResponse, Request
    from scrapy.utils.test import get_crawler

    from stream_dedup.scrapy import DedupMiddleware, LocalChecker

    body = build_site().resources["/article/0"].body
    for on_error in ("keep", "drop"):
        crawler = get_crawler()
        checker = LocalChecker(Settings())
        calls: list[Any] = []

        def broken(*args: Any, calls: list[Any] = calls, **kwargs: Any) -> Any:
            calls.append(args)
            raise exc
        checker.dedup.index.lookup = broken  # type: ignore[method-assign]
        mw = DedupMiddleware(checker, crawler.stats, statuses=frozenset({200}),
                             on_error=on_error)
        request = Request("https://a.example/page")
        response = HtmlResponse(request.url, body=body, headers={"Content-Type": HTML_TYPE},
                                request=request)
        caplog.clear()
        with caplog.at_level("ERROR", logger="stream_dedup.scrapy"):
            if on_error == "keep":
                got = asyncio.run(mw.process_response(request, response))
                assert got is response and "stream_dedup" not in request.meta
                assert str(exc) in request.meta["stream_dedup_error"]
            else:
                with pytest.raises(IgnoreRequest):
                    asyncio.run(mw.process_response(request, response))
        asyncio.run(checker.close())
        assert len(calls) == 1 and mw.errors == 1
        stats = crawler.stats.get_stats()
        assert stats["stream_dedup/error/internal-error"] == 1, stats
        assert [r for r in caplog.records if "https://a.example/page" in r.getMessage()
                and type(exc).__name__ in r.getMessage()], caplog.text
