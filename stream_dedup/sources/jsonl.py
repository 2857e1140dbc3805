"""Pages from JSON objects: one per line of a .jsonl file, or one per Kafka message.

Schema (one JSON object):

    url        str, required, non-empty
    html       str: the page as text; stored as UTF-8 bytes     } one of the two is required;
    body_b64   str: the raw body bytes, base64                  } body_b64 wins if both are given
    fetched_at str, optional (ISO-8601 expected, not checked)
    status     int, optional (HTTP status)
    headers    optional: {"Name": "value", ...} or [["Name", "value"], ...]

With `html`, the Content-Type becomes "text/html; charset=utf-8", because that is what the
stored bytes are, whatever charset a header from the original response named; send
`body_b64` to keep raw bytes and their original headers.

`page_from_json` is a pure function of the message bytes so the Kafka consumer and the replay
of a .jsonl file share it. Every problem is a `PageError` whose kind says what was wrong:
bad-json, no-url, bad-url, no-body, bad-base64, bad-field; with a namespace field
(--namespace-field, read as Kafka messages read it: namespace_field.py), bad-namespace.

Speed: a 46 KB page is a 61 KB base64 string in a JSON object; the standard library's json and
base64 took 59 + 144 µs for it, orjson and pybase64 (SIMD) take 18 + 3. They run first; the
standard library, which accepts more (NaN, lone surrogates; base64 wrapped over lines), decides
whatever they refuse, so what is accepted and every error message stay as they were, with one
exception: orjson reads an integer beyond 64 bits as a float, so such a `status` is refused
(bad-field) where it used to be taken.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pybase64

from stream_dedup.errors import PageError
from stream_dedup.models import Page, Rejected
from stream_dedup.sources.namespace_field import namespace_in
from stream_dedup.sources.stats import SourceStats

_HTML_TYPE = ("Content-Type", "text/html; charset=utf-8")


def page_from_json(data: bytes | str, source: str | None = None) -> Page:
    """Build a Page from one JSON object (bytes or text); raises PageError if it is unusable."""
    return page_from_object(json_object(data), source)


def json_object(data: bytes | str) -> dict[str, Any]:
    """One JSON object, parsed; a PageError (bad-json) if it is not one."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        obj = _json_loads(data)
    if not isinstance(obj, dict):
        raise PageError("bad-json", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def page_from_object(obj: dict[str, Any], source: str | None = None) -> Page:
    """`page_from_json` of the object already parsed."""
    url = obj.get("url")
    if not isinstance(url, str) or not url.strip():
        raise PageError("no-url", f"'url' must be a non-empty string, got {shorten(url)}")
    check_url(url)
    headers = _headers(obj.get("headers"))
    fetched_at = obj.get("fetched_at")
    if fetched_at is not None and not isinstance(fetched_at, str):
        raise PageError("bad-field", f"'fetched_at' must be a string, got {shorten(fetched_at)}")
    status = obj.get("status")
    if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
        raise PageError("bad-field", f"'status' must be an integer, got {shorten(status)}")
    if obj.get("body_b64") is not None:
        body = decode_b64(obj["body_b64"])
    elif obj.get("html") is not None:
        html = obj["html"]
        if not isinstance(html, str):
            raise PageError("bad-field", f"'html' must be a string, got {shorten(html)}")
        # Lone surrogates (JSON allows "\ud800") cannot be UTF-8; they become U+FFFD.
        body = html.encode("utf-8", "replace")
        # The text was decoded by the producer and is stored as UTF-8 here, whatever charset
        # a Content-Type header from the original response may name.
        headers = (*(h for h in headers if h[0].lower() != "content-type"), _HTML_TYPE)
    else:
        raise PageError("no-body", "neither 'html' nor 'body_b64' is given")
    return Page(
        url=url, body=body, headers=headers, fetched_at=fetched_at, status=status, source=source
    )


def check_url(url: str) -> None:
    """A URL must be valid Unicode: JSON allows a lone surrogate ("\\ud800"), which no
    output (a Kafka key, a UTF-8 line) can carry."""
    if url.isascii():
        return
    try:
        url.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PageError("bad-url", f"the URL is not valid Unicode (a lone surrogate at "
                                   f"character {exc.start})") from None


def _json_loads(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are ValueErrors
        raise PageError("bad-json", f"not valid JSON: {exc}") from None
    except RecursionError:  # "[[[[..." a hundred thousand deep
        raise PageError("bad-json", "not valid JSON: nested too deeply") from None


def shorten(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _headers(value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if isinstance(value, dict):
        pairs: list[Any] = list(value.items())
    elif isinstance(value, list):
        pairs = value
    else:
        raise PageError("bad-field", f"'headers' must be an object or a list, got {shorten(value)}")
    out: list[tuple[str, str]] = []
    for pair in pairs:
        if (
            not isinstance(pair, list | tuple)
            or len(pair) != 2
            or not all(isinstance(part, str) for part in pair)
        ):
            raise PageError(
                "bad-field", f"header must be a [name, value] of strings: {shorten(pair)}"
            )
        out.append((pair[0], pair[1]))
    return tuple(out)


def decode_b64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise PageError("bad-base64", f"'body_b64' must be a string, got {shorten(value)}")
    if "-" not in value and "_" not in value:
        try:  # the common case: one line, standard alphabet
            return pybase64.b64decode(value + "=" * (-len(value) % 4), validate=True)
        except (binascii.Error, ValueError):
            pass  # white space, or not base64: the general path below says which
    text = "".join(value.split())  # producers that wrap lines at 76 columns
    text += "=" * (-len(text) % 4)  # and ones that drop the padding
    altchars = b"-_" if ("-" in text or "_" in text) else None
    try:
        return base64.b64decode(text, altchars=altchars, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PageError("bad-base64", f"'body_b64' is not valid base64: {exc}") from None


def iter_jsonl(
    path: str | os.PathLike[str], stats: SourceStats | None = None, *, name: str | None = None,
    namespace_field: str = "",
) -> Iterator[Page | Rejected]:
    """One Page per non-blank line of a .jsonl / .ndjson file, gzipped or not; each in the
    namespace its `namespace_field` names, if one is given (--namespace-field).

    A bad line becomes a Rejected (source f"{name}#{line number}", 1-based, raw = the line)
    and reading goes on. A file that cannot be read yields one "unreadable-file" Rejected; a
    gzip stream that breaks off yields a "truncated" one after the lines before it.
    """
    path = Path(path)
    name = name or path.name
    stats = stats if stats is not None else SourceStats()
    stats.files += 1
    lineno = 0
    try:
        # Read 1 MiB at a time: with the default 8 KiB, the kernel's copies of a 270 MB
        # crawl (~66,000 reads) took 13 % of a replay's CPU; 1 MiB: 6 % less time.
        with open(path, "rb", buffering=1 << 20) as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            with gzip.GzipFile(fileobj=raw) if gzipped else raw as lines:
                for lineno, line in enumerate(lines, 1):
                    if not _blank(line):
                        yield _item(line, f"{name}#{lineno}", stats, namespace_field)
    except EOFError:
        yield _reject(
            stats,
            "truncated",
            f"{path}: gzip stream ends early after line {lineno}",
            f"{name}#{lineno + 1}",
        )
    except (OSError, zlib.error) as exc:
        yield _reject(
            stats,
            "unreadable-file",
            f"cannot read {path}{f' after line {lineno}' if lineno else ''}: {exc}",
            f"{name}#{lineno + 1}",
        )


def iter_jsonl_range(
    path: str | os.PathLike[str], start: int, end: int, first_line: int,
    stats: SourceStats, *, name: str, namespace_field: str = "",
) -> Iterator[Page | Rejected]:
    """`iter_jsonl` of the lines of a plain (not gzipped) JSONL file that start in bytes
    [start, end): `start` is 0 or just after a newline, `first_line` the number of the
    line there (what `iter_jsonl` would count). The range that starts the file counts the
    file in `stats`."""
    path = Path(path)
    if start == 0:
        stats.files += 1
    lineno = first_line - 1
    try:
        with open(path, "rb") as fh:
            fh.seek(start)
            data = fh.read(end - start)
            if data and not data.endswith(b"\n"):  # the range's last line goes on past `end`
                data += fh.readline()
        # Lines end at b"\n" only, as iterating over the file splits them. (bytes.split
        # compares every byte in Python 3.11: 5 instructions a byte, 1.35 G on 270 MB.)
        for lineno, line in enumerate(io.BytesIO(data), first_line):
            if not _blank(line):
                yield _item(line, f"{name}#{lineno}", stats, namespace_field)
    except OSError as exc:
        yield _reject(
            stats,
            "unreadable-file",
            f"cannot read {path}{f' after line {lineno}' if lineno else ''}: {exc}",
            f"{name}#{lineno + 1}",
        )


def _blank(line: bytes) -> bool:
    """Only white space: isspace stops at the first other byte, where strip() would copy
    the whole line (~27 KB) to test it."""
    return not line or line.isspace()


def _item(line: bytes, source: str, stats: SourceStats, namespace_field: str = ""
          ) -> Page | Rejected:
    """The page of a line as read: its b"\n" and any b"\r" are JSON white space, so a good
    line is not copied to drop them; a bad one is read again without them, for the error
    and raw bytes the line itself gives."""
    stats.records += 1
    try:
        page = _line_page(line, source, namespace_field)
    except PageError:
        line = line.rstrip(b"\r\n")
        try:
            page = _line_page(line, source, namespace_field)
        except PageError as exc:
            return _reject(stats, exc.kind, exc.message, source, line, _url_of(line))
    stats.pages += 1
    if page.status is not None and not 200 <= page.status < 300:
        stats.non_2xx += 1
    return page


def _line_page(line: bytes, source: str, namespace_field: str) -> Page:
    if not namespace_field:
        return page_from_json(line, source)
    obj = json_object(line)
    namespace = namespace_in(obj, namespace_field)  # a bad one refuses the line first
    page = page_from_object(obj, source)
    return page if not namespace else Page(page.url, page.body, page.headers, page.fetched_at,
                                           page.status, source, namespace=namespace)


def _reject(
    stats: SourceStats,
    kind: str,
    message: str,
    source: str,
    raw: bytes | None = None,
    url: str | None = None,
) -> Rejected:
    stats.rejected[kind] += 1
    return Rejected(url=url, kind=kind, message=message, source=source, raw=raw)


def _url_of(line: bytes) -> str | None:
    """The url of a rejected line, when there is one, so the reject can name its page."""
    try:
        url = _json_loads(line).get("url")
    except (PageError, AttributeError):
        return None
    if not isinstance(url, str):
        return None
    return url.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate becomes "?"
