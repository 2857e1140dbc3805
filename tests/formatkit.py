"""One page as a message of each Kafka input format (tests/test_formats.py, bench/formats.py).

Each builder gives (key, value, headers) for a Kafka record whose page, read by `serve`, is
the page given: what a crawler publishing that format would send for it.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

from stream_dedup.core.decode import _decide
from stream_dedup.models import Page

Message = tuple[bytes | None, bytes, list[tuple[str, bytes]]]

# --json-fields for the made-up dialect of `mapped`: every page field under another name,
# one of them nested
MAPPING = "url=link,body_b64=payload.raw,status=code,fetched_at=crawled,headers=http_headers"


def json_message(page: Page) -> Message:
    """--input-format json: the raw bytes as body_b64, with their headers."""
    return page.url.encode(), json.dumps(_json_fields(page)).encode(), []


def html_message(page: Page) -> Message:
    """--input-format html: the raw bytes; the metadata in Kafka headers."""
    headers = [(name, value.encode()) for name, value in page.headers]
    if page.fetched_at:
        headers.append(("fetched-at", page.fetched_at.encode()))
    if page.status is not None:
        headers.append(("status", str(page.status).encode()))
    return page.url.encode(), page.body, headers


def mapped_message(page: Page) -> Message:
    """--input-format json --json-fields MAPPING: a crawler's own dialect."""
    obj = _json_fields(page)
    return page.url.encode(), json.dumps({
        "link": obj["url"], "payload": {"raw": obj["body_b64"], "size": len(page.body)},
        "code": obj.get("status"), "crawled": obj.get("fetched_at"),
        "http_headers": obj["headers"], "crawlid": "c-1"}).encode(), []


def firehose(page: Page, crawlid: str = "crawl-1", appid: str = "testapp") -> dict[str, Any]:
    """Scrapy Cluster's crawled_firehose object for the page: the body decoded in the
    charset a browser (and our decoder) would take, named in `encoding`; headers as lists;
    a naive UTC timestamp, as its KafkaPipeline writes them."""
    codec, _, text, _ = _decide(page.body, page.header("content-type"))
    grouped: dict[str, list[str]] = {}
    for name, value in page.headers:
        grouped.setdefault(name, []).append(value)
    stamp = (page.fetched_at or "2026-01-01T00:00:00Z").removesuffix("Z")
    return {"url": page.url, "response_url": page.url, "status_code": page.status or 200,
            "status_msg": "OK", "body": text, "encoding": codec,
            "response_headers": grouped,
            "request_headers": {"User-Agent": ["Scrapy/2.11 (+https://scrapy.org)"]},
            "timestamp": stamp, "crawlid": crawlid, "appid": appid, "links": [],
            "attrs": None}


def firehose_message(page: Page, crawlid: str = "crawl-1") -> Message:
    """--input-format scrapy-cluster."""
    return page.url.encode(), json.dumps(firehose(page, crawlid)).encode(), []


def warc_message(page: Page) -> Message:
    """One uncompressed WARC/1.0 response record: the HTTP head and the raw body."""
    head = f"HTTP/1.1 {page.status or 200} OK\r\n" + "".join(
        f"{n}: {v}\r\n" for n, v in page.headers if n.lower() not in (
            "content-length", "transfer-encoding", "content-encoding")) + \
        f"Content-Length: {len(page.body)}\r\n\r\n"
    block = head.encode("utf-8", "replace") + page.body
    record = ("WARC/1.0\r\nWARC-Type: response\r\n"
              f"WARC-Record-ID: <urn:uuid:{random.Random(page.url).getrandbits(128):032x}>\r\n"
              f"WARC-Date: {page.fetched_at or '2026-01-01T00:00:00Z'}\r\n"
              f"WARC-Target-URI: {page.url}\r\n"
              "Content-Type: application/http; msgtype=response\r\n"
              f"Content-Length: {len(block)}\r\n\r\n").encode("utf-8", "replace")
    return page.url.encode(), record + block + b"\r\n\r\n", []


def _json_fields(page: Page) -> dict[str, Any]:
    obj: dict[str, Any] = {"url": page.url, "body_b64": base64.b64encode(page.body).decode(),
                           "headers": [list(h) for h in page.headers]}
    if page.fetched_at:
        obj["fetched_at"] = page.fetched_at
    if page.status is not None:
        obj["status"] = page.status
    return obj
