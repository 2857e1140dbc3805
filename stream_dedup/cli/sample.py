"""A synthetic crawl the project builds itself (demo and tests; no third-party pages).

One site template (header, navigation, footer) around generated articles, with every kind
of duplicate a crawler meets: byte-identical copies under other URLs, the same text in
other markup, near-duplicates (a changed date line, a few edited words), distinct articles
sharing the template, short stub pages, a non-HTML response, a revisit record, and a broken
JSONL line. `expected` says what each page should get.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

_SYLLABLES = "ka lo mi re su ta ne po vi da ze ru fo gi ha ly me no pa qu si to wu xe yo".split()


def _vocabulary(rng: random.Random, size: int = 4000) -> list[str]:
    return ["".join(rng.choices(_SYLLABLES, k=rng.randint(1, 4))) for _ in range(size)]


@dataclass(frozen=True)
class SamplePage:
    url: str
    html: str
    expected: tuple[str, str]  # (decision, reason)
    content_type: str = "text/html; charset=utf-8"


def _page(title: str, paragraphs: list[str], nav: list[str]) -> str:
    links = "".join(f'<li><a href="/{n}">{n.title()}</a></li>' for n in nav)
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>" + title + "</title>"
        "<style>body{font-family:serif}</style><script>var t=Date.now();</script></head><body>"
        f"<header><h1>Example News</h1><nav><ul>{links}</ul></nav></header>"
        f"<main><article><h2>{title}</h2>{body}</article></main>"
        "<footer><p>Copyright Example News. All rights reserved. Contact us.</p></footer>"
        "</body></html>"
    )


def build(seed: int = 7, articles: int = 40) -> list[SamplePage]:
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    nav = [rng.choice(vocab) for _ in range(12)]
    pages: list[SamplePage] = []
    for i in range(articles):
        paras = [
            " ".join(rng.choices(vocab, k=rng.randint(60, 120))).capitalize() + "."
            for _ in range(rng.randint(24, 32))
        ]
        title = " ".join(rng.choices(vocab, k=4)).title()
        html = _page(title, paras, nav)
        url = f"http://site{seed}.example.test/news/{i}"
        pages.append(SamplePage(url, html, ("keep", "unique")))
        kind = i % 5
        if kind == 0:  # the same bytes under a tracking URL
            pages.append(SamplePage(url + "?utm_source=feed", html, ("drop", "exact")))
        elif kind == 1:  # same text, other markup, case and punctuation
            other = html.replace("<p>", "<div class='p'>").replace("</p>", "</div>")
            other = other.replace(".", " !").upper().replace("<!DOCTYPE HTML>", "<!doctype html>")
            pages.append(SamplePage(url + "/print", other, ("drop", "canonical")))
        elif kind == 2:  # a near-duplicate: one word edited (resemblance ~0.99)
            words = " ".join(paras).split()
            words[rng.randrange(len(words))] = rng.choice(vocab)
            pages.append(SamplePage(url + "/amp", _page(title, [" ".join(words)], nav),
                                    ("drop", "near")))
    for j in range(4):  # short stubs sharing the template: never near-duplicates
        stub = _page("Tag " + nav[j], [f"No articles tagged {nav[j]} yet."], nav)
        pages.append(SamplePage(f"http://site{seed}.example.test/tag/{nav[j]}", stub,
                                ("keep", "unique")))
    return pages


def _warc_record(kind: str, url: str, block: bytes, extra: dict[str, str] | None = None) -> bytes:
    record_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{kind} {url} {len(block)}")
    headers = {
        "WARC-Type": kind,
        "WARC-Record-ID": f"<urn:uuid:{record_id}>",
        "WARC-Date": "2026-01-02T03:04:05Z",
        "WARC-Target-URI": url,
        "Content-Type": "application/http; msgtype=response",
        **(extra or {}),
        "Content-Length": str(len(block)),
    }
    head = "WARC/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return gzip.compress(head.encode() + block + b"\r\n\r\n", mtime=0)  # one member a record


def _http(body: bytes, content_type: str) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def write_warc(pages: list[SamplePage], path: Path) -> None:
    """A gzipped WARC: a response per page, plus a non-HTML response that replay must skip
    and count, and a revisit record of the first page (decided: unchanged)."""
    with open(path, "wb") as fh:
        for page in pages:
            fh.write(_warc_record("response", page.url,
                                  _http(page.html.encode("utf-8"), page.content_type)))
        fh.write(_warc_record("response", "http://example.test/site.css",
                              _http(b"body { color: black }", "text/css")))
        fh.write(_warc_record("revisit", pages[0].url, b"", {
            "WARC-Profile": "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"}))


def write_jsonl(pages: list[SamplePage], path: Path) -> None:
    """JSONL pages, alternating `html` and `body_b64`, plus one line that is not JSON."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as fh:
        for i, page in enumerate(pages):
            if i % 2:
                rec = {"url": page.url, "body_b64": base64.b64encode(page.html.encode()).decode(),
                       "headers": {"Content-Type": page.content_type}}
            else:
                rec = {"url": page.url, "html": page.html}
            fh.write(json.dumps(rec) + "\n")
        fh.write("{this is not json\n")


def write_sample(directory: Path, seed: int = 7) -> tuple[Path, Path, list[SamplePage]]:
    """sample.warc.gz (first two thirds) and sample.jsonl (the rest) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    pages = build(seed)
    cut = len(pages) * 2 // 3
    warc, jsonl = directory / "sample.warc.gz", directory / "sample.jsonl"
    write_warc(pages[:cut], warc)
    write_jsonl(pages[cut:], jsonl)
    return warc, jsonl, pages
