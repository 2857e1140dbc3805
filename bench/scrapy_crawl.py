"""Issue 30: what the Scrapy middleware costs a crawl. The same local site crawled by a real
Scrapy spider without the middleware (`off`), with it deciding in process (`library`), and
with it asking a running `serve` over POST /v1/check (`http`, when a broker is given);
modes alternated within each round, each crawl a fresh process.

The site: the HTML responses of ../shared/corpora/warc (read with the project's reader,
`iter_inputs`), the first --pages of them at /p/0 ... /p/N-1, served from memory by aiohttp
in this process, each page with two links put at the end of its body (/p/2i+1, /p/2i+2), and
an index page at / that links them all: every mode fetches every page (a dropped page is
fetched, then not parsed), so the modes differ by what deciding costs. Meta refreshes are
off (a corpus page refreshes to its original host). Exact copies in the corpus then differ
by those links only: they are `canonical` drops.

Reading the figures: a dropped page is not parsed by the spider (lxml, for its links), so
on a crawl with duplicates the middleware can make the crawl faster; a spider whose pages
are all new pays the check and saves nothing. Over HTTP a check's latency is mostly
queueing in `serve`, the crawl, the site and the service sharing the host's cores.

    python3 bench/scrapy_crawl.py                       # 400 pages, 5 rounds, off vs library
    python3 bench/scrapy_crawl.py --bootstrap 127.0.0.1:9092   # + http (serve on that broker)

Printed: per mode, the median of the crawl's own time (Scrapy's elapsed_time_seconds: spider
opened to closed) and of the whole process (interpreter, imports and the middleware's set-up
included), each as a ratio to `off`; the time the checks themselves took
(stream_dedup/check_seconds) and per check; the pages fetched, parsed and decided.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from benchlib import load_warc_pages, table  # noqa: E402
from scrapykit import Resource, SiteServer  # noqa: E402

MIDDLEWARE = {"stream_dedup.scrapy.DedupMiddleware": 540}


def build_site(n: int) -> dict[str, Resource]:
    pages, _ = load_warc_pages()
    seen: list[Any] = [p for p in pages if p.body][:n]
    site = {}
    for i, p in enumerate(seen):
        links = "".join(f'<a href="/p/{j}">next</a>' for j in (2 * i + 1, 2 * i + 2)
                        if j < n).encode()
        # inside the body: a parser drops what follows </html>
        lower = p.body.lower()
        at = max(lower.rfind(b"</body>"), lower.rfind(b"</html>")) if b"</" in lower else -1
        at = at if at >= 0 else len(p.body)
        site[f"/p/{i}"] = Resource(p.body[:at] + links + p.body[at:],
                                   p.header("Content-Type") or "text/html")
    index = "".join(f'<li><a href="/p/{i}">{i}</a></li>' for i in range(len(seen)))
    site["/"] = Resource(f"<html><body><ul>{index}</ul></body></html>".encode())
    return site


def crawl_once(start: str, out: Path, mode: str, service: str) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "LOG_LEVEL": "WARNING", "ROBOTSTXT_OBEY": False, "TELNETCONSOLE_ENABLED": False,
        "METAREFRESH_ENABLED": False,  # a corpus page that refreshes to its original host
        "DOWNLOADER_MIDDLEWARES": {} if mode == "off" else MIDDLEWARE,
    }
    if mode == "http":
        settings["STREAM_DEDUP_URL"] = service
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--crawl", start, str(out),
                    json.dumps(settings)], check=True, timeout=900,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - t0
    stats = json.loads((out / "stats.json").read_text())
    return {"wall": wall, "crawl": stats["elapsed_time_seconds"],
            "fetched": stats.get("downloader/response_count", 0),
            "parsed": stats.get("response_received_count", 0),
            "check": stats.get("stream_dedup/check_seconds", 0.0),
            "decided": Counter({k.removeprefix("stream_dedup/"): v for k, v in stats.items()
                                if k.startswith(("stream_dedup/keep", "stream_dedup/drop",
                                                 "stream_dedup/reject", "stream_dedup/skip"))})}


def crawl_child(start: str, out: Path, settings: dict[str, Any]) -> None:
    """The crawl itself, in its own process (the reactor cannot start twice)."""
    import scrapy
    from scrapy.crawler import CrawlerProcess

    origin = start.removesuffix("/")

    class TreeSpider(scrapy.Spider):
        name = "tree"
        start_urls = [start]

        def parse(self, response: Any) -> Any:
            # the site's own links, joined to its origin: a corpus page's <base href> would
            # send response.follow to the page's original host
            for href in response.css("a::attr(href)").getall():
                if href.startswith("/p/"):
                    yield scrapy.Request(origin + href, self.parse)

    process = CrawlerProcess(settings)
    crawler = process.create_crawler(TreeSpider)
    process.crawl(crawler)
    process.start()
    stats = {k: v for k, v in crawler.stats.get_stats().items() if isinstance(v, int | float)}
    (out / "stats.json").write_text(json.dumps(stats))


def start_serve(bootstrap: str, work: Path) -> tuple[subprocess.Popen[bytes], str]:
    from opskit import free_port, get, wait_for

    tag = f"scrapybench-{uuid.uuid4().hex[:8]}"
    port = free_port()
    log = open(work / "serve.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "stream_dedup", "serve", "--bootstrap-servers", bootstrap,
         "--input-topic", f"{tag}-pages", "--decisions-topic", f"{tag}-decisions",
         "--dead-letter-topic", f"{tag}-dead", "--group-id", tag, "--http-port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)})
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return get(url + "/v1/stats")[0] == 200
        except OSError:
            return False
    wait_for("serve's HTTP API", ready, timeout=120)
    return proc, url


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bootstrap", default="", help="a Kafka broker: adds the http mode")
    ap.add_argument("--crawl", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.crawl:
        crawl_child(args.crawl[0], Path(args.crawl[1]), json.loads(args.crawl[2]))
        return
    site = build_site(args.pages)
    modes = ["off", "library"] + (["http"] if args.bootstrap else [])
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp, SiteServer(site) as server:
        work = Path(tmp)
        proc, service = start_serve(args.bootstrap, work) if args.bootstrap else (None, "")
        try:
            for r in range(args.rounds):
                order = modes if r % 2 == 0 else modes[::-1]
                for mode in order:
                    out = work / f"{mode}-{r}"
                    out.mkdir()
                    results[mode].append(crawl_once(server.url + "/", out, mode, service))
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            if proc is not None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
    base_crawl = statistics.median(x["crawl"] for x in results["off"])
    base_wall = statistics.median(x["wall"] for x in results["off"])
    rows = []
    for mode in modes:
        crawl = statistics.median(x["crawl"] for x in results[mode])
        wall = statistics.median(x["wall"] for x in results[mode])
        last = results[mode][-1]
        check = statistics.median(x["check"] for x in results[mode])
        decided = sum(v for k, v in last["decided"].items() if not k.startswith("skip"))
        check_ms = f"{check / decided * 1000:.2f}" if decided else "-"
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(last["decided"].items())) or "-"
        rows.append([mode, f"{crawl:.2f}", f"{crawl / base_crawl:.2f}", f"{check:.2f}",
                     check_ms, f"{wall:.2f}", f"{wall / base_wall:.2f}", str(last["fetched"]),
                     str(last["parsed"]), outcomes])
    print(f"## Scrapy crawl of {len(site)} pages ({len(site) - 1} from the corpus and an "
          f"index), {args.rounds} alternated rounds (medians; bench/scrapy_crawl.py)\n")
    print(table(["mode", "crawl s", "÷ off", "checks s", "ms a check", "process s", "÷ off",
                 "fetched", "parsed", "decisions (last round)"], rows))
    print("\n(crawl: spider opened to closed, Scrapy's elapsed_time_seconds; checks: the "
          "middleware's time in them, stream_dedup/check_seconds: in process, CPU in the reactor's "
          "thread; over HTTP, the latencies of concurrent checks, summed; process: the crawl's "
          "whole process, interpreter start and imports included. A dropped page is not "
          "parsed by the spider: the crawl's saving)")


if __name__ == "__main__":
    main()
