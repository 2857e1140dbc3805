"""Write small WARC and ARC files for tests, byte by byte.

The repository must not contain third-party pages, so tests build their archives here.
Records are assembled by hand rather than with warcio's writer because the point is to
produce the files real crawlers produce, including the broken ones: bodies stored de-chunked
under `Transfer-Encoding: chunked`, ARC v1 without blank lines between records, truncated
files, garbage between records.
"""

from __future__ import annotations

import gzip
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import brotli

WARC_DATE = "2024-01-02T03:04:05Z"
ARC_DATE = "20080430204826"


@dataclass(frozen=True)
class Resp:
    """One HTTP response as a crawler would have fetched it."""

    url: str
    body: bytes
    content_type: str | None = "text/html; charset=utf-8"
    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    content_encoding: str | None = None  # gzip, x-gzip, deflate, raw-deflate, br
    chunked: bool = False  # really chunk the stored body
    claim_chunked: bool = False  # say chunked, store the body as is
    date: str = WARC_DATE


def encode(body: bytes, coding: str | None) -> bytes:
    if coding in ("gzip", "x-gzip"):
        return gzip.compress(body, mtime=0)
    if coding == "deflate":
        return zlib.compress(body)
    if coding == "raw-deflate":
        compressor = zlib.compressobj(wbits=-15)
        return compressor.compress(body) + compressor.flush()
    if coding == "br":
        return bytes(brotli.compress(body))
    return body


def chunk(body: bytes, size: int = 7) -> bytes:
    parts = [
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
        for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


def http_block(resp: Resp) -> bytes:
    """The HTTP response bytes a WARC `response` block or an ARC record holds."""
    payload = encode(resp.body, resp.content_encoding)
    lines = [f"HTTP/1.1 {resp.status} X"]
    if resp.content_type is not None:
        lines.append(f"Content-Type: {resp.content_type}")
    if resp.content_encoding:
        coding = "deflate" if resp.content_encoding == "raw-deflate" else resp.content_encoding
        lines.append(f"Content-Encoding: {coding}")
    if resp.chunked or resp.claim_chunked:
        lines.append("Transfer-Encoding: chunked")
        if resp.chunked:
            payload = chunk(payload)
    else:
        lines.append(f"Content-Length: {len(payload)}")
    lines += [f"{name}: {value}" for name, value in resp.headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def warc_record(
    rec_type: str,
    block: bytes,
    *,
    url: str | None = None,
    date: str = WARC_DATE,
    content_type: str | None = None,
    headers: Sequence[tuple[str, str]] = (),
    version: str = "1.1",
    length: int | None = None,
) -> bytes:
    """One WARC record; `length` overrides Content-Length to fake broken writers."""
    lines = [
        f"WARC/{version}",
        f"WARC-Type: {rec_type}",
        f"WARC-Record-ID: <urn:uuid:{uuid.uuid4()}>",
        f"WARC-Date: {date}",
    ]
    if url is not None:
        lines.append(f"WARC-Target-URI: {url}")
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append(f"Content-Length: {len(block) if length is None else length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + block + b"\r\n\r\n"


def response(resp: Resp, version: str = "1.1") -> bytes:
    return warc_record(
        "response",
        http_block(resp),
        url=resp.url,
        date=resp.date,
        content_type="application/http; msgtype=response",
        version=version,
    )


def request(url: str) -> bytes:
    block = f"GET / HTTP/1.1\r\nHost: {url.split('/')[2]}\r\n\r\n".encode()
    return warc_record("request", block, url=url, content_type="application/http; msgtype=request")


def revisit(url: str) -> bytes:
    block = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n"
    return warc_record(
        "revisit",
        block,
        url=url,
        content_type="application/http; msgtype=response",
        headers=[
            ("WARC-Profile", "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest")
        ],
    )


def metadata(url: str) -> bytes:
    return warc_record(
        "metadata", b"via: http://example.org/\r\n", url=url, content_type="application/warc-fields"
    )


def warcinfo() -> bytes:
    return warc_record(
        "warcinfo",
        b"software: warcgen\r\nformat: WARC File Format 1.1\r\n",
        content_type="application/warc-fields",
    )


def write_warc(
    path: Path, records: Iterable[bytes | Resp], *, gzip_records: bool = True, version: str = "1.1"
) -> Path:
    """Write records (Resp items become `response` records); one gzip member per record."""
    with open(path, "wb") as out:
        for record in records:
            data = response(record, version) if isinstance(record, Resp) else record
            out.write(gzip.compress(data, mtime=0) if gzip_records else data)
    return path


def arc_record(
    url: str, block: bytes, *, mime: str = "text/html", date: str = ARC_DATE, ip: str = "192.0.2.1"
) -> bytes:
    """ARC v1 record: header line `URL IP date mime length`, then exactly `length` bytes."""
    return f"{url} {ip} {date} {mime} {len(block)}\n".encode() + block


def arc_filedesc(name: str = "test.arc") -> bytes:
    body = b"1 0 warcgen\nURL IP-address Archive-date Content-type Archive-length\n"
    return arc_record(f"filedesc://{name}", body, mime="text/plain", ip="0.0.0.0")


def arc_response(resp: Resp, date: str = ARC_DATE) -> bytes:
    mime = (resp.content_type or "no-type").split(";")[0]
    return arc_record(resp.url, http_block(resp), mime=mime, date=date)


def write_arc(
    path: Path,
    records: Iterable[bytes | Resp],
    *,
    gzip_records: bool = False,
    separators: bool = True,
) -> Path:
    """ARC file; `separators=False` drops the newline between records (Common Crawl 2008)."""
    with open(path, "wb") as out:
        out_records = [arc_filedesc(path.name)]
        out_records += [arc_response(r) if isinstance(r, Resp) else r for r in records]
        for record in out_records:
            data = record + b"\n" if separators else record
            out.write(gzip.compress(data, mtime=0) if gzip_records else data)
    return path
