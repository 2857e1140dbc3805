"""One archive record as a reader frames it (`Frame`), and what it becomes (`convert`): a
Page, a Rejected, or a Skipped. Pure: no files, no client; every reader of WARC and ARC
records (replay's FastWARC and lenient readers, a Kafka message's record in
`warc_message.py`) ends here, so a record gives the same page whichever way it came.

What is a page: an HTTP `response` record whose response is HTML, and a `resource` record
with an HTML content type (no HTTP, the block is the document: a browser's snapshot, a
crawler that stores what it fetched as is). A Wayback-style response (HTTP headers in the
WARC header, the block the bare body) counts as HTML by its WARC Content-Type. A `revisit`
record of a profile that says the payload did not change becomes a Page without a body,
decided against the version it names. Non-2xx responses are Pages too: whether to keep them
is the engine's decision. Every other record is Skipped, with its record type (or
"non-html") as the kind.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from stream_dedup.errors import PageError
from stream_dedup.models import Page, Rejected, Revisit, Skipped
from stream_dedup.sources.http_response import (
    Headers,
    decode_body,
    header_value,
    is_html,
    looks_like_http,
    parse_response,
)

ArchiveFormat = Literal["warc", "arc"]

GZIP_MAGIC = b"\x1f\x8b\x08"
HEAD = 1 << 16  # enough for the HTTP headers of a response
# Records whose block a reader keeps (the others are counted and skipped unread)
PAGE_TYPES = ("response", "resource")
REVISIT_PROFILES = ("identical-payload-digest", "server-not-modified")
_ISO_DATE = re.compile(r"\d{4}-\d\d-\d\dT")


@dataclass(frozen=True, slots=True)
class Frame:
    """One archive record as framed, before any HTTP parsing; `block` only for PAGE_TYPES."""

    start: int
    rec_type: str
    url: str | None
    date: str | None
    content_type: str | None
    headers: Headers
    length: int
    block: bytes | None = None
    truncated: bool = False


def convert(frame: Frame, source: str | None) -> Page | Rejected | Skipped:
    """A frame becomes a Page, a Rejected, or a Skipped (counted by its kind).

    A truncated record of any type is reported: it means the input was cut short.
    """
    block = frame.block or b""
    if frame.truncated:
        msg = f"record holds {len(block)} of its {frame.length} bytes: the input ends early"
        if frame.length < 0:
            msg = "the input ends inside the record header"
        return Rejected(frame.url, "truncated", msg, source, block)
    if frame.rec_type == "revisit":
        return _revisit(frame, source)
    if frame.rec_type not in PAGE_TYPES:
        return Skipped(frame.rec_type, source)
    if not frame.url:
        return Rejected(None, "no-url", f"{frame.rec_type} record without a target URI",
                        source, block)
    status: int | None = None
    if frame.rec_type == "response" and looks_like_http(block):
        try:
            response = parse_response(block)
            if not is_html(response.header("Content-Type") or frame.content_type):
                return Skipped("non-html", source)
            body = decode_body(response.body, response.headers)
        except PageError as exc:
            return Rejected(frame.url, exc.kind, exc.message, source, block)
        headers, status = response.headers, response.status
    elif is_html(frame.content_type):
        # A resource, or a Wayback-style response: HTTP headers (if any) in the WARC header
        # block, block = bare body.
        body = block
        headers = tuple(h for h in frame.headers if not h[0].lower().startswith("warc-"))
    elif "application/http" in (frame.content_type or "").lower():
        msg = f"block declared application/http but starts with {block[:40]!r}"
        return Rejected(frame.url, "bad-http", msg, source, block)
    else:
        return Skipped("non-html", source)
    digest = header_value(frame.headers, "WARC-Payload-Digest")
    return Page(frame.url, body, headers, frame.date, status, source,
                payload_digest=digest.strip() if digest else None)


def _revisit(frame: Frame, source: str | None) -> Page | Rejected | Skipped:
    """A revisit record of a profile that says "the payload has not changed" becomes a
    Page without a body (decided against the version it refers to); other profiles are
    skipped."""
    profile = (header_value(frame.headers, "WARC-Profile") or "").strip()
    if not profile.endswith(REVISIT_PROFILES):
        return Skipped("revisit", source)
    if not frame.url:
        return Rejected(None, "no-url", "revisit record without a target URI", source)
    refers = uri(header_value(frame.headers, "WARC-Refers-To-Target-URI"))
    refers_date = warc_date(header_value(frame.headers, "WARC-Refers-To-Date"))
    digest = header_value(frame.headers, "WARC-Payload-Digest")
    return Page(frame.url, b"", (), frame.date, None, source,
                payload_digest=digest.strip() if digest else None,
                revisit=Revisit(profile, refers, refers_date))


def wanted(head: bytes, content_type: str | None) -> bool:
    """Whether a page record's block is worth reading whole: False only for an HTTP
    response whose headers, complete in `head`, name a non-HTML type (a video need not sit
    in RAM)."""
    if not looks_like_http(head) or (b"\r\n\r\n" not in head and b"\n\n" not in head):
        return True
    try:
        return is_html(parse_response(head).header("Content-Type") or content_type)
    except PageError:
        return True


def uri(value: str | None) -> str | None:
    return value.strip().removeprefix("<").removesuffix(">") if value else None


def warc_date(value: str | None) -> str | None:
    return value.strip() if value and _ISO_DATE.match(value.strip()) else None


def arc_date(value: bytes) -> str:
    d = value.decode("ascii").ljust(14, "0")
    return f"{d[:4]}-{d[4:6]}-{d[6:8]}T{d[8:10]}:{d[10:12]}:{d[12:14]}Z"
