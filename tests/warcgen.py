"""Write small WARC and ARC files for tests, byte by byte.

The repository must not contain third-party pages, so tests build their archives here.
Records are assembled by hand rather than with warcio's writer because the point is to
produce the files real crawlers produce, including the broken ones: bodies stored de-chunked
under `Transfer-Encoding: chunked`, ARC v1 without blank lines between records, truncated
files, garbage between records.
"""

from __future__ import annotations

import gzip
import random
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


def split_cases(directory: Path, bodies: Sequence[bytes], seed: int = 5) -> dict[str, Path]:
    """Archives that trip a reader cutting files into parts (replay/parts.py), each with
    HTML responses of `bodies` (at least 31) around the trap:
    - nested.warc.gz: a crawled .warc.gz as a payload: gzip members stored whole inside a
      member, which open WARC headers (a cut found there is not a record start);
    - nested.warc: plain, a text payload holding WARC records (header lines in a body);
    - truncated.warc.gz: the last gzip member cut short in its header;
    - damaged.warc.gz: a corrupt member and junk between members, mid-file (FastWARC
      stops there, the lenient reader goes on);
    - pages.arc.gz: one gzip member per ARC record; junk.arc.gz: the same with junk
      between two members mid-file; pages.arc: plain; cc.arc: ARC v1 without separators
      (Common Crawl 2008: a header line glued to the last line of the body before);
    - stream.warc.gz: the whole WARC one gzip stream (cannot be cut)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    resps = [Resp(f"http://split.example/{i}", body) for i, body in enumerate(bodies)]
    out: dict[str, Path] = {}
    crawled = b"".join(gzip.compress(response(Resp(f"http://inner.example/{i}",
                                                   rng.randbytes(6000), "application/gzip")),
                                     mtime=0) for i in range(8))
    # stored (level 0, as deflate stores incompressible data): the inner members lie in
    # the file as they are, in one stored block of up to 64 KiB
    trap = gzip.compress(response(Resp("http://split.example/crawl.warc.gz", crawled,
                                       "application/gzip")), compresslevel=0, mtime=0)
    out["nested.warc.gz"] = directory / "nested.warc.gz"
    out["nested.warc.gz"].write_bytes(b"".join(
        [gzip.compress(warcinfo(), mtime=0), *(gzip.compress(response(r), mtime=0)
                                               for r in resps[:12]), trap,
         *(gzip.compress(response(r), mtime=0) for r in resps[12:])]))
    text = b"".join(response(Resp(f"http://inner.example/t{i}", bodies[i])) for i in range(3))
    out["nested.warc"] = write_warc(directory / "nested.warc", [
        warcinfo(), *resps[:10], Resp("http://split.example/dump.txt", text, "text/plain"),
        *resps[10:30]], gzip_records=False)
    last = gzip.compress(response(resps[30]), mtime=0)
    truncated = write_warc(directory / "truncated.warc.gz", [warcinfo(), *resps[:30]])
    truncated.write_bytes(truncated.read_bytes() + last[:40])  # FastWARC drops it unsaid
    out["truncated.warc.gz"] = truncated
    members = [gzip.compress(response(r), mtime=0) for r in resps[:30]]
    broken = bytearray(members[10])
    broken[40:60] = b"X" * 20
    members[10] = bytes(broken)
    members.insert(20, b"junk between members\r\n")
    out["damaged.warc.gz"] = directory / "damaged.warc.gz"
    out["damaged.warc.gz"].write_bytes(gzip.compress(warcinfo(), mtime=0) + b"".join(members))
    out["pages.arc.gz"] = write_arc(directory / "pages.arc.gz", resps[:30], gzip_records=True)
    head = write_arc(directory / "junk.arc.gz", resps[:15], gzip_records=True).read_bytes()
    tail = b"".join(gzip.compress(arc_response(r) + b"\n", mtime=0) for r in resps[15:30])
    out["junk.arc.gz"] = directory / "junk.arc.gz"
    out["junk.arc.gz"].write_bytes(head + b"junk between members\n" + tail)
    out["pages.arc"] = write_arc(directory / "pages.arc", resps[:30])
    out["cc.arc"] = write_arc(directory / "cc.arc", resps[:30], separators=False)
    out["stream.warc.gz"] = directory / "stream.warc.gz"
    out["stream.warc.gz"].write_bytes(gzip.compress(
        b"".join([warcinfo(), *(response(r) for r in resps[:30])]), mtime=0))
    return out
