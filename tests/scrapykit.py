"""The Scrapy tests' site and crawler (tests/test_scrapy.py).

A small site of pages that link to each other, served from memory by aiohttp in a thread of
the test process (`SiteServer`, which logs every request with its Referer), and a crawl of it
by a real Scrapy spider in a subprocess (Twisted's reactor cannot start twice in a process):

    python tests/scrapykit.py START_URL OUT_DIR [-s NAME=VALUE ...]

(the middleware is on when DOWNLOADER_MIDDLEWARES says so: the tests pass the README's) and
writes OUT_DIR/stats.json (the crawl's stats) and OUT_DIR/pages.jsonl (one line a page the
spider parsed: its URL and `response.meta["stream_dedup"]`). The spider follows every link
of every page it gets, on the site's host only.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from stream_dedup.http.thread import BackgroundServer

HTML_TYPE = "text/html; charset=utf-8"
_VOCAB = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ri", "so", "tu", "va", "ze")
          for b in ("bar", "cen", "dop", "fim", "gul", "hes", "jot", "kav", "lim", "mur",
                    "nix", "pos", "quo", "rut", "sel", "tam", "ulk", "vey", "wob", "yin")]


@dataclass(frozen=True)
class Resource:
    body: bytes
    content_type: str = HTML_TYPE
    status: int = 200
    gzip: bool = False  # sent with Content-Encoding: gzip (Scrapy inflates it)
    location: str = ""  # a redirect's target


@dataclass
class Site:
    resources: dict[str, Resource] = field(default_factory=dict)
    # paths linked only from a page that must be dropped: never to be fetched
    only_from_duplicates: set[str] = field(default_factory=set)
    # what each duplicate copies, by path: "exact", "canonical", "near"
    copies: dict[str, str] = field(default_factory=dict)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


def page(title: str, paragraphs: list[str], links: list[tuple[str, str]],
         markup: str = "plain") -> bytes:
    """An HTML page; `markup="fancy"` puts the same text in other markup (a canonical copy)."""
    if markup == "plain":
        body = "".join(f"<p>{p}</p>" for p in paragraphs)
        nav = "".join(f'<li><a href="{href}">{text}</a></li>' for href, text in links)
        html = (f"<!DOCTYPE html><html><head><title>{title}</title></head><body>"
                f"<h1>{title}</h1>{body}<ul>{nav}</ul></body></html>")
    else:
        body = "".join(f'<div class="para"><span>{p}</span></div>\n' for p in paragraphs)
        nav = "".join(f'<a class="nav" href="{href}"><b>{text}</b></a> ' for href, text in links)
        html = (f"<html>\n<head>\n<meta charset='utf-8'><title>{title}</title>\n</head>\n"
                f"<body class='x'><header><h1 id='t'>{title}</h1></header>\n<main>{body}"
                f"</main><nav>{nav}</nav></body></html>")
    return html.encode()


def build_site(seed: int = 7, uniques: int = 6) -> Site:
    """The site: an index; unique articles, each with a child page; an exact copy, a
    canonical copy and a near-duplicate of articles, each linked from its original (so the
    original is fetched first) and each linking to a page nothing else links to; an image,
    a JSON file, a 404, a redirect and a gzip-encoded page."""
    rng = random.Random(seed)
    site = Site()
    r = site.resources
    arts = [[words(rng, 120) for _ in range(12)] for _ in range(uniques)]
    nav: list[tuple[str, str]] = []
    for i, paras in enumerate(arts):
        child = f"/child/{i}"
        r[child] = Resource(page(f"Child {i}", [words(rng, 80) for _ in range(3)], [("/", "home")]))
        links = [(child, "more"), ("/", "home")]
        if i == 0:
            links.append(("/copies/exact", "mirror"))
        if i == 1:
            links.append(("/copies/canonical", "print view"))
        if i == 2:
            links.append(("/copies/near", "updated"))
        r[f"/article/{i}"] = Resource(page(f"Article {i}", paras, links))
        nav.append((f"/article/{i}", f"article {i}"))
    # exact: the same bytes as /article/0 (so the same links: see the Referer check)
    r["/copies/exact"] = r["/article/0"]
    # canonical: /article/1's text in other markup, its "more" going elsewhere
    r["/copies/canonical"] = Resource(page("Article 1", arts[1], [
        ("/secret/canonical", "more"), ("/", "home"), ("/copies/canonical", "print view")],
        markup="fancy"))
    # near: /article/2 with a few words changed, its "more" going elsewhere
    edited = list(arts[2])
    for k in (1, 5, 9):
        ws = edited[k].split()
        ws[40:44] = ["edited", "words", "here", "now"]
        edited[k] = " ".join(ws)
    r["/copies/near"] = Resource(page("Article 2", edited, [
        ("/secret/near", "more"), ("/", "home"), ("/copies/near", "updated")]))
    for name in ("canonical", "near"):
        r[f"/secret/{name}"] = Resource(page(f"Secret {name}", [words(rng, 90)], []))
        site.only_from_duplicates.add(f"/secret/{name}")
    site.copies = {"/copies/exact": "exact", "/copies/canonical": "canonical",
                   "/copies/near": "near"}
    r["/logo.png"] = Resource(b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "image/png")
    r["/data.json"] = Resource(b'{"a": [1, 2, 3]}', "application/json")
    r["/missing"] = Resource(page("Not here", ["nothing at this address"], []), status=404)
    r["/moved"] = Resource(b"", status=301, location="/landed")
    r["/landed"] = Resource(page("Landed", [words(rng, 150)], [("/", "home")]))
    r["/zipped"] = Resource(page("Zipped", [words(rng, 150) for _ in range(3)], [("/", "home")]),
                            gzip=True)
    extra = [("/logo.png", "logo"), ("/data.json", "data"), ("/missing", "gone"),
             ("/moved", "moved"), ("/zipped", "zipped")]
    r["/"] = Resource(page("Home", ["the index of this site"], nav + extra))
    return site


class SiteServer(BackgroundServer):
    """`with SiteServer(site) as server:` serves `site` on 127.0.0.1:`server.port` (a free
    port); `server.log` lists (path, referer path or "") of every request, in order."""

    def __init__(self, resources: dict[str, Resource]) -> None:
        self.resources = resources
        self.log: list[tuple[str, str]] = []
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        super().__init__(app, "127.0.0.1", 0,
                         runner=lambda a: web.AppRunner(a, access_log=None))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        referer = request.headers.get("Referer", "")
        self.log.append((request.path, referer.removeprefix(self.url)))
        res = self.resources.get(request.path)
        if res is None:
            raise web.HTTPNotFound()
        if res.location:
            return web.Response(status=res.status, headers={"Location": res.location})
        headers = {"Content-Type": res.content_type}
        body = res.body
        if res.gzip:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, status=res.status, headers=headers)


# --- the crawl (run as a script: a subprocess of the test) -----------------------------------
def crawl(start: str, out: Path, overrides: dict[str, str]) -> None:
    import scrapy
    from scrapy.crawler import CrawlerProcess
    from scrapy.http import TextResponse

    pages = open(out / "pages.jsonl", "w", encoding="utf-8")  # noqa: SIM115

    class SiteSpider(scrapy.Spider):
        name = "site"
        start_urls = [start]

        def parse(self, response: Any) -> Any:
            pages.write(json.dumps({"url": response.url,
                                    "decision": response.meta.get("stream_dedup"),
                                    "error": response.meta.get("stream_dedup_error")}) + "\n")
            if isinstance(response, TextResponse) and "html" in response.headers.get(
                    "Content-Type", b"").decode():
                skip = self.settings.get("KIT_SKIP_PREFIX")  # these: meta stream_dedup_skip
                for href in response.css("a::attr(href)").getall():
                    meta = {"stream_dedup_skip": True} if skip and href.startswith(skip) else {}
                    yield response.follow(href, self.parse, meta=meta)

    settings: dict[str, Any] = {
        "LOG_LEVEL": "INFO", "ROBOTSTXT_OBEY": False, "TELNETCONSOLE_ENABLED": False,
        "CONCURRENT_REQUESTS": 1, "DOWNLOAD_DELAY": 0,
    }
    for name, value in overrides.items():
        settings[name] = json.loads(value) if value[:1] in "{[" else value
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(SiteSpider)
    process.crawl(crawler)
    process.start()
    pages.close()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, int | float)}
    (out / "stats.json").write_text(json.dumps(stats, indent=1, sort_keys=True))


if __name__ == "__main__":
    args = sys.argv[1:]
    given: dict[str, str] = {}
    rest = args[2:]
    while rest:
        flag, pair, *rest = rest
        assert flag == "-s", f"usage: scrapykit.py START OUT [-s NAME=VALUE ...], got {flag}"
        name, _, value = pair.partition("=")
        given[name] = value
    crawl(args[0], Path(args[1]), given)
