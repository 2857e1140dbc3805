"""Kafka messages -> Page | Rejected (pure: no client here, just bytes, key and headers).

Input formats:
- "json" (default): the value is one JSONL page object (`url` + `html` or `body_b64`,
  optional `fetched_at`, `status`, `headers`), exactly as in replay's JSONL files.
- "html": the value is the raw HTML bytes, the key is the URL, and metadata travels in Kafka
  headers: `content-type`, `fetched-at`, `status` (any header is kept as an HTTP header).
- "scrapy-cluster", or "json" with --json-fields: a crawler's own JSON (kafka/dialects.py).
- "warc": the value is one WARC record, plain or gzipped (warc_message.py); the key is
  not read. A record that is not a page (request, metadata...) is a Skipped.
With --carry-fields, `dialect` names the fields each page carries into its decision, and
with --namespace-field the field naming its namespace (for html and warc: Kafka headers;
a bad one is a `bad-namespace` reject, namespace_field.py).

A page's `source` is "topic/partition/offset": stable across re-deliveries.

Nothing here raises on a record's content: a header key that is not UTF-8 (read leniently by
`sources.records`), a URL that is not valid Unicode, a `status` that is not an HTTP status
code all become a Rejected whose raw bytes go to the dead-letter topic.
"""

from __future__ import annotations

from dataclasses import replace

from stream_dedup.errors import PageError
from stream_dedup.kafka.batches import KafkaHeaders, is_utf8, raw_header_key
from stream_dedup.kafka.dialects import Dialect, too_large_error
from stream_dedup.kafka.warc_message import page_from_warc
from stream_dedup.models import Carried, Page, Rejected, Skipped
from stream_dedup.sources.jsonl import page_from_json


def page_from_message(
    value: bytes | None,
    key: bytes | None,
    headers: KafkaHeaders,
    source: str,
    *,
    input_format: str,
    max_bytes: int,
    position: int | None = None,
    dialect: Dialect | None = None,
) -> Page | Rejected | Skipped:
    """One consumed record as a Page, or a Rejected that says why it is not one (or, for
    warc, a Skipped). `position`: the record's page id (models.position_id); `dialect`:
    dialects.dialect_for the settings (None: the plain `json`, `html` or `warc` reading)."""
    url = _text(key)
    bad = [name for name, _ in headers if not is_utf8(name)]
    if bad:
        shown = ", ".join(repr(raw_header_key(name)) for name in bad[:3])
        return Rejected(url, "bad-header", f"header key is not UTF-8: {shown}", source,
                        value or b"")
    if value is None:
        return Rejected(url, "no-body", "the message has no value (tombstone)", source, b"")
    if len(value) > max_bytes:
        return Rejected(url, "too-large",
                        f"{len(value)} bytes > max_page_bytes={max_bytes}", source, value)
    carried: Carried = ()
    namespace = ""
    try:
        if dialect is not None and dialect.json:
            return dialect.read(value, source, url, position)
        if input_format == "json":
            page = page_from_json(value, source)
            return page if position is None else replace(page, position=position)
        if dialect is not None:  # the carried fields are Kafka headers (html, warc)
            carried, too_large = dialect.from_headers(headers)
            if too_large is not None:
                raise too_large_error(too_large)
            namespace = dialect.header_namespace(headers)
        if input_format == "warc":
            item = page_from_warc(value, source, max_bytes=max_bytes, position=position)
            if isinstance(item, Page) and (carried or namespace):
                return replace(item, carried=carried, namespace=namespace)
            return item if not carried or isinstance(item, Skipped) else replace(
                item, carried=carried)
        if not url:
            raise PageError("no-url", "html input needs the page URL as the message key")
        if "\ufffd" in url and key is not None:
            try:
                key.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PageError("bad-url", f"the message key (the URL) is not UTF-8: {exc}"
                                ) from None
        meta = {name.lower(): _text(raw) or "" for name, raw in headers}
        return Page(
            url=url,
            body=value,
            headers=tuple((name, _text(raw) or "") for name, raw in headers),
            fetched_at=meta.get("fetched-at") or None,
            status=_status(meta.get("status")),
            source=source,
            position=position,
            carried=carried,
            namespace=namespace,
        )
    except PageError as err:
        return Rejected(url, err.kind, err.message, source, value, carried)


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")
def _status(text: str | None) -> int | None:
    """An HTTP status code: three ASCII digits ("²".isdigit() is true, int("²") fails)."""
    if not text:
        return None
    text = text.strip()
    if len(text) == 3 and text.isascii() and text.isdigit():
        return int(text)
    raise PageError("bad-field", f"header 'status' must be a 3-digit HTTP status code, "
                                 f"got {text[:40]!r}")
