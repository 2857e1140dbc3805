"""Crawlers' own JSON messages -> Page | Rejected, and the fields carried into decisions (pure).

A dialect says which message field holds each page field; the first of a field's
alternatives that the message has (not null) wins:

    page field   scrapy-cluster (crawled_firehose)   json (sources/jsonl.py)
    url          response_url | url                  url
    html         body                                html
    body_b64     -                                   body_b64
    encoding     encoding                            -
    status       status_code                         status
    fetched_at   timestamp                           fetched_at
    headers      response_headers                    headers

`--json-fields` (config_checks.json_field_map) replaces entries of the input format's column, so it
adapts `json` to any crawler's dialect and refines `scrapy-cluster` too: Scrapy Cluster run
with KAFKA_BASE_64_ENCODE sends the body base64-encoded, read with
`--input-format scrapy-cluster --json-fields body_b64=body`.

A mapped dialect reads its fields more leniently than the `json` schema, because crawlers
differ: `status` may be a 3-digit string; `fetched_at` a string (kept as it is: Scrapy
Cluster's ISO time without an offset is UTC, as the index reads one) or a number of seconds
since 1970 (milliseconds from 1e11 on: no crawl is from the year 5138) written as ISO-8601
UTC; `headers` an object of strings or of lists of strings (one header line per value, as
Scrapy Cluster sends them) or a list of [name, value] pairs.

Bytes. `html`/`body` is text the crawler already decoded, in `encoding` (UTF-8 when none).
It is stored encoded in that charset again, which gives back the bytes the crawler fetched
(so the exact layer matches a copy of the page read from a WARC file or sent raw), with a
Content-Type naming that charset, so that the text the analysis decodes is the text sent. A
text that charset cannot hold (a crawler's replacement characters) or whose bytes the
decoder would read as another text, or a charset the decoder does not know as a web
charset, is stored as UTF-8 and labelled so. A `body_b64`
keeps its bytes and headers; an `encoding` beside it becomes the Content-Type's charset.

Carried fields (`--carry-fields`) are JSON values copied into the decision as they are,
null when the message lacks them; one whose JSON is over CARRY_MAX_CHARS characters is
refused (`carried-too-large`): they are identifiers to join on, and a clipped identifier
would join wrongly. With the `html` format they are Kafka headers (UTF-8 text). A reject
carries them too whenever the message could be read that far.

The namespace field (`--namespace-field`; namespace_field.py) is read like a carried field:
a message field of the JSON formats, a Kafka header of `html` and `warc`. A message without it
is decided in the process's namespace; one whose value cannot name a namespace is refused
(`bad-namespace`), carrying its carried fields.

Reject kinds of a mapped dialect (each says which message field): bad-json, no-url, bad-url,
no-body, bad-body, bad-base64, unknown-encoding, bad-headers, bad-status, bad-timestamp,
carried-too-large, bad-namespace.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stream_dedup.config import Settings
from stream_dedup.config_checks import FieldPath, carry_names, json_field_map
from stream_dedup.core.decode import decode_html, lookup_label
from stream_dedup.errors import PageError
from stream_dedup.models import Carried, Page, Rejected
from stream_dedup.sources.jsonl import check_url, decode_b64, json_object, page_from_object, shorten
from stream_dedup.sources.namespace_field import field_at as _at
from stream_dedup.sources.namespace_field import namespace_in, namespace_in_headers

_NUMBERS = (int, float)  # bool is an int
CARRY_MAX_CHARS = 1024  # a carried value's JSON, at most
_MS_FROM = 1e11  # a number timestamp this large or larger is in milliseconds
_LAST_SECOND = 253402300799  # 9999-12-31T23:59:59Z: the last time ISO-8601 writes in 4 digits

Fields = dict[str, tuple[FieldPath, ...]]
PRESETS: dict[str, Fields] = {
    "json": {name: ((name,),) for name in
             ("url", "html", "body_b64", "status", "fetched_at", "headers")},
    "scrapy-cluster": {
        "url": (("response_url",), ("url",)),
        "html": (("body",),),
        "encoding": (("encoding",),),
        "status": (("status_code",),),
        "fetched_at": (("timestamp",),),
        "headers": (("response_headers",),),
    },
}


@dataclass(frozen=True)
class Dialect:
    """How one input format's messages are read. `json`: the value is JSON, read by `read`,
    with `fields` (None: the plain `json` schema, sources/jsonl.py); else the carried fields
    are Kafka headers (`from_headers`). `carry`: the fields copied into decisions;
    `namespace`: the field (or header) naming a page's namespace ("": none)."""

    json: bool
    fields: Fields | None = None
    carry: tuple[tuple[str, FieldPath], ...] = ()
    namespace: str = ""

    def read(self, value: bytes, source: str | None, key_url: str | None = None,
             position: int | None = None) -> Page | Rejected:
        """One message as a Page, or a Rejected (url: the message's, else `key_url`)."""
        url: str | None = key_url
        carried: Carried = ()
        try:
            obj = json_object(value)
            found = self._get(obj, "url") if self.fields is not None else obj.get("url")
            if isinstance(found, str):
                url = found.encode("utf-8", "replace").decode("utf-8")
            carried, too_large = self._carried(obj)
            namespace = namespace_in(obj, self.namespace) if self.namespace else ""
            if self.fields is None:
                page = page_from_object(obj, source)
                page = Page(page.url, page.body, page.headers, page.fetched_at, page.status,
                            source, position, carried=carried, namespace=namespace)
            else:
                page = self._page(obj, source, position, carried, namespace)
            if too_large is not None:
                raise too_large_error(too_large)
            return page
        except PageError as err:
            return Rejected(url, err.kind, err.message, source, value, carried)

    def from_headers(self, headers: Sequence[tuple[str, bytes]]) -> tuple[Carried, str | None]:
        """The carried fields of an `html` message: its Kafka headers of those names (the
        first of each; any case), as text; and the name of one too large (None in them)."""
        by_name: dict[str, bytes] = {}
        for name, raw in headers:
            by_name.setdefault(name.lower(), raw)
        return _carry([(name, None if (value := by_name.get(name.lower())) is None
                        else value.decode("utf-8", "replace")) for name, _ in self.carry])

    def header_namespace(self, headers: Sequence[tuple[str, bytes]]) -> str:
        """The namespace an `html` or `warc` message's header names ("": none); a
        PageError (bad-namespace) when it cannot name one."""
        return namespace_in_headers(headers, self.namespace) if self.namespace else ""

    # --- the mapped dialects ---------------------------------------------------------
    def _get(self, obj: dict[str, Any], page_field: str) -> Any:
        assert self.fields is not None
        for path in self.fields.get(page_field, ()):
            value = _at(obj, path)
            if value is not None:
                return value
        return None

    def _named(self, page_field: str) -> str:
        """The message field(s) a page field is read from, for an error message."""
        assert self.fields is not None
        return " | ".join(".".join(p) for p in self.fields.get(page_field, ())) or "-"

    def _page(self, obj: dict[str, Any], source: str | None, position: int | None,
              carried: Carried, namespace: str) -> Page:
        url = self._get(obj, "url")
        if not isinstance(url, str) or not url.strip():
            raise PageError("no-url", f"the URL, {self._named('url')!r}, must be a non-empty "
                                      f"string, got {shorten(url)}")
        check_url(url)
        headers = self._headers(self._get(obj, "headers"))
        encoding = self._get(obj, "encoding")
        codec = self._codec(encoding)
        b64 = self._get(obj, "body_b64")
        if b64 is not None:
            body = decode_b64(b64)
            if codec is not None and encoding is not None:
                headers = _content_type(headers, codec)
        else:
            html = self._get(obj, "html")
            if html is None:
                raise PageError("no-body", f"the message has no body "
                                           f"({self._named('html')!r} is missing or null)")
            if not isinstance(html, str):
                raise PageError("bad-body", f"the body, {self._named('html')!r}, must be a "
                                            f"string, got {shorten(html)}")
            body, codec = _encoded(html, codec or "utf-8")
            headers = _content_type(headers, codec)
        return Page(url, body, headers, self._time(obj), self._status(obj), source, position,
                    carried=carried, namespace=namespace)

    def _codec(self, encoding: Any) -> str | None:
        """The decoder's codec for `encoding`; None: none given, or one only Python knows
        (the body is then stored as UTF-8)."""
        if encoding is None:
            return None
        if not isinstance(encoding, str):
            raise PageError("unknown-encoding", f"{self._named('encoding')!r} must be a "
                                                f"charset name, got {shorten(encoding)}")
        codec = lookup_label(encoding)
        if codec is None:
            try:
                codecs.lookup(encoding)
            except LookupError:
                raise PageError("unknown-encoding", f"{self._named('encoding')!r}: no such "
                                                    f"charset: {shorten(encoding)}") from None
        return codec

    def _headers(self, value: Any) -> tuple[tuple[str, str], ...]:
        if value is None:
            return ()
        out: list[tuple[str, str]] = []
        if isinstance(value, dict):  # {name: value or [values]}: JSON names are strings
            for name, values in value.items():
                if type(values) is str:
                    out.append((name, values))
                    continue
                if type(values) is not list:
                    raise self._bad_header([name, values])
                for one in values:
                    if type(one) is not str:
                        raise self._bad_header([name, values])
                    out.append((name, one))
        elif isinstance(value, list):  # [[name, value], ...]
            for pair in value:
                if (type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str
                        or type(pair[1]) is not str):
                    raise self._bad_header(pair)
                out.append((pair[0], pair[1]))
        else:
            raise PageError("bad-headers", f"{self._named('headers')!r} must be an object or "
                                           f"a list, got {shorten(value)}")
        return tuple(out)

    def _bad_header(self, got: Any) -> PageError:
        return PageError("bad-headers", f"{self._named('headers')!r}: a header must be a "
                                        f"name and string values, got {shorten(got)}")

    def _status(self, obj: dict[str, Any]) -> int | None:
        status = self._get(obj, "status")
        if status is None:
            return None
        if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 999:
            return status
        if (isinstance(status, str) and len(status.strip()) == 3 and status.strip().isascii()
                and status.strip().isdigit()):
            return int(status)
        raise PageError("bad-status", f"{self._named('status')!r} must be an HTTP status code "
                                      f"(100-999), got {shorten(status)}")

    def _time(self, obj: dict[str, Any]) -> str | None:
        when = self._get(obj, "fetched_at")
        if when is None or isinstance(when, str):
            return when
        if isinstance(when, _NUMBERS) and not isinstance(when, bool) and math.isfinite(when):
            seconds = when / 1000 if when >= _MS_FROM else when
            if 0 <= seconds <= _LAST_SECOND:
                text = datetime.fromtimestamp(seconds, UTC).isoformat()
                return text.replace("+00:00", "Z")
        raise PageError("bad-timestamp", f"{self._named('fetched_at')!r} must be an ISO-8601 "
                                         f"string or seconds (or milliseconds) since 1970, got "
                                         f"{shorten(when)}")

    # --- carried fields ---------------------------------------------------------------
    def _carried(self, obj: dict[str, Any]) -> tuple[Carried, str | None]:
        if not self.carry:
            return (), None
        return _carry([(name, _at(obj, path)) for name, path in self.carry])


def dialect_for(settings: Settings) -> Dialect | None:
    """The Dialect of `settings`' input format and flags; None when the plain reading does:
    `json` without json_fields, carry_fields or namespace_field, `html` and `warc` without
    carry_fields or namespace_field."""
    names = carry_names(settings.carry_fields)
    fields = json_field_map(settings.json_fields)
    carry = tuple((name, tuple(name.split("."))) for name in names)
    namespace = settings.namespace_field.strip()
    fmt = settings.input_format
    if fmt == "json" and not fields:
        return Dialect(True, None, carry, namespace) if names or namespace else None
    if fmt in PRESETS:
        return Dialect(True, {**PRESETS[fmt], **fields}, carry, namespace)
    return Dialect(False, None, carry, namespace) if names or namespace else None


def _carry(values: list[tuple[str, Any]]) -> tuple[Carried, str | None]:
    """The values to carry, each None in place of one too large; and the name of the first
    too large, if one is."""
    too_large = None
    out = []
    for name, value in values:
        if value is not None and not isinstance(value, _NUMBERS) and _size(
                value) > CARRY_MAX_CHARS:
            too_large = too_large or name
            value = None
        out.append((name, value))
    return tuple(out), too_large


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def too_large_error(name: str) -> PageError:
    return PageError("carried-too-large", f"the carried field {name!r} is over "
                                          f"{CARRY_MAX_CHARS} characters of JSON: carry "
                                          f"identifiers, not content")


def _encoded(text: str, codec: str) -> tuple[bytes, str]:
    """`text` as bytes in `codec`, if that is an ASCII-compatible web charset that holds
    it and the decoder reads those bytes as `text` again; else in UTF-8 (a lone surrogate,
    which JSON allows, becomes U+FFFD). Checked by decoding: some encoders are lossy
    (Python's euc_jp writes "¥" as "\\"), and the decoder reads bytes that are valid UTF-8
    as UTF-8 whatever a single-byte label says."""
    if codec != "utf-8" and not codec.startswith("utf-16") and lookup_label(codec) == codec:
        if text.isascii():  # the same bytes in every ASCII-compatible charset (and faster)
            return text.encode("ascii"), codec
        try:
            body = text.encode(codec)
        except UnicodeEncodeError:
            pass
        else:
            if decode_html(body, f"text/html; charset={codec}") == text:
                return body, codec
    return text.encode("utf-8", "replace"), "utf-8"


def _content_type(headers: tuple[tuple[str, str], ...], codec: str,
                  ) -> tuple[tuple[str, str], ...]:
    """The headers with one Content-Type whose charset is `codec` (the stored bytes')."""
    kept = tuple(h for h in headers if h[0].lower() != "content-type")
    return (*kept, ("Content-Type", f"text/html; charset={codec}"))
