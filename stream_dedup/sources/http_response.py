"""Lenient HTTP/1.x response parsing and body decoding for archived responses.

Archives store what crawlers saw, and crawlers see everything: LF-only line ends, header lines
without a colon, `Transfer-Encoding: chunked` on bodies the crawler already de-chunked,
`Content-Encoding: gzip` on bodies it already inflated, truncated gzip streams, brotli.
So this module never trusts a header on its own word: a coding is undone only when the bytes
really carry it, and a body that fails to decode but already looks like HTML is used as is.

Only `PageError` leaves this module; zlib/brotli errors are translated here, at the edge.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import brotli

from stream_dedup.errors import PageError

Headers = tuple[tuple[str, str], ...]

HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})

_STATUS_LINE = re.compile(rb"^HTTP/\d+(?:\.\d+)?[ \t]+(\d{1,3})(?:[ \t]+(.*))?$", re.IGNORECASE)
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n]*)?(\r?\n)")
# A body "looks like HTML" if it opens with a tag or names one of the document tags early on.
_HTML_START = re.compile(rb"\s*<[A-Za-z!?/]")
_HTML_MARK = re.compile(rb"<(?:!doctype|html|head|body)\b", re.IGNORECASE)
_IDENTITY = frozenset({"", "identity", "none", "null", "binary", "7bit", "8bit", "utf-8", "utf8"})


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """A parsed response block; `body` is still exactly as stored (not decoded)."""

    status: int
    reason: str
    headers: Headers
    body: bytes

    def header(self, name: str) -> str | None:
        return header_value(self.headers, name)


def header_value(headers: Headers, name: str) -> str | None:
    """First value of `name` (case-insensitive), as HTTP intends for single-valued headers."""
    lname = name.lower()
    for key, value in headers:
        if key.lower() == lname:
            return value
    return None


def is_html(content_type: str | None) -> bool:
    """True for text/html and application/xhtml+xml, whatever the case, params or padding."""
    if not content_type:
        return False
    mime = content_type.split(";", 1)[0].split(",", 1)[0].strip().lower()
    return mime in HTML_TYPES


def looks_like_html(body: bytes) -> bool:
    """Cheap sniff used only to rescue bodies whose declared coding is a lie.

    Compressed data almost surely has a NUL byte in its first KiB; markup almost never does.
    """
    head = body[:4096].removeprefix(b"\xef\xbb\xbf")
    if b"\x00" in head[:1024]:
        return False
    return bool(_HTML_START.match(head) or _HTML_MARK.search(head))


def looks_like_http(block: bytes) -> bool:
    return block[:5].upper() == b"HTTP/"


def _text(raw: bytes) -> str:
    # Header bytes are mostly ASCII; UTF-8 first (modern servers), Latin-1 never fails.
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def parse_response(block: bytes) -> HttpResponse:
    """Split a stored HTTP response into status, headers and the raw body.

    The header block ends at the first empty line, CRLF or bare LF; if there is none the
    whole block is headers and the body is empty (a HEAD-like or cut-off capture).
    """
    crlf = block.find(b"\r\n\r\n")
    lf = block.find(b"\n\n", 0, crlf + 1 if crlf >= 0 else len(block))  # not into the body
    if crlf >= 0 and (lf < 0 or crlf < lf):
        head, body = block[:crlf], block[crlf + 4 :]
    elif lf >= 0:
        head, body = block[:lf], block[lf + 2 :]
    else:
        head, body = block, b""
    lines = head.replace(b"\r\n", b"\n").split(b"\n")
    match = _STATUS_LINE.match(lines[0].strip())
    if match is None:
        raise PageError("bad-http", f"not an HTTP status line: {lines[0][:80]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t") and headers:  # obsolete line folding
            folded_name, folded_value = headers[-1]
            headers[-1] = (folded_name, f"{folded_value} {_text(line.strip())}")
            continue
        name, sep, value = line.partition(b":")
        if sep and name.strip():
            headers.append((_text(name.strip()), _text(value.strip())))
    reason = _text(match.group(2) or b"").strip()
    return HttpResponse(int(match.group(1)), reason, tuple(headers), body)


def _looks_chunked(body: bytes) -> bool:
    # The first chunk must be well formed: size line, data, line end; or, if the body stops
    # inside the first chunk, at least a CRLF-terminated size line (as chunked bodies have).
    match = _CHUNK_SIZE.match(body)
    if match is None:
        return False
    end = match.end() + int(match.group(1), 16)
    if end >= len(body):
        return match.group(2) == b"\r\n"
    return body[end : end + 1] in (b"\r", b"\n")


def dechunk(body: bytes) -> bytes | None:
    """Undo chunked transfer coding; None if `body` does not really look chunked.

    A chunk stream that breaks off (truncated capture) keeps what was decoded so far plus the
    rest of the broken chunk: for dedup a nearly complete page beats no page.
    """
    if not _looks_chunked(body):
        return None
    out: list[bytes] = []
    pos = 0
    while pos < len(body):
        match = _CHUNK_SIZE.match(body, pos)
        if match is None:
            break
        size = int(match.group(1), 16)
        if size == 0:
            break
        start = match.end()
        out.append(body[start : start + size])
        pos = start + size
        if body.startswith(b"\r\n", pos):
            pos += 2
        elif body.startswith(b"\n", pos):
            pos += 1
    return b"".join(out)


def _inflate(data: bytes, wbits: int) -> bytes:
    # decompressobj, not zlib.decompress: a stream cut short still yields its prefix.
    decoder = zlib.decompressobj(wbits)
    out = decoder.decompress(data) + decoder.flush()
    if not out and not decoder.eof:
        raise zlib.error("no data could be inflated")
    return out


def _decode_one(data: bytes, coding: str) -> bytes:
    if coding in ("gzip", "x-gzip"):
        return _inflate(data, 32 + zlib.MAX_WBITS)  # gzip, or zlib from confused servers
    if coding == "deflate":
        # RFC 9110 says zlib-wrapped; many servers send raw deflate.
        try:
            return _inflate(data, zlib.MAX_WBITS)
        except zlib.error:
            return _inflate(data, -zlib.MAX_WBITS)
    if coding == "br":
        return _unbrotli(data)
    raise ValueError(f"unsupported content coding {coding!r}")


def _unbrotli(data: bytes) -> bytes:
    try:
        return bytes(brotli.decompress(data))
    except brotli.error:
        # Truncated stream: keep the prefix the streaming decoder can produce.
        out = bytes(brotli.Decompressor().process(data))
        if not out:
            raise
        return out


def decode_body(body: bytes, headers: Headers) -> bytes:
    """The payload as the server meant it: transfer coding and content codings undone.

    Raises PageError("bad-encoding") only when a declared coding cannot be undone *and*
    the bytes do not already look like HTML.
    """
    transfer = (header_value(headers, "Transfer-Encoding") or "").lower()
    if "chunked" in transfer:
        dechunked = dechunk(body)
        if dechunked is not None:
            body = dechunked
    encoding = header_value(headers, "Content-Encoding") or ""
    codings = [c.strip().lower() for c in encoding.split(",")]
    codings = [c for c in codings if c not in _IDENTITY]
    if not codings or not body:  # an empty body is empty in any coding
        return body
    decoded = body
    try:
        for coding in reversed(codings):  # applied in listed order, so undone in reverse
            decoded = _decode_one(decoded, coding)
    except (zlib.error, brotli.error, ValueError) as exc:
        if looks_like_html(body):
            return body
        raise PageError(
            "bad-encoding", f"Content-Encoding {encoding!r} could not be decoded: {exc}"
        ) from exc
    return decoded
