"""One Kafka message's value as one WARC record (`serve --input-format warc`) -> a Page, a
Rejected or a Skipped. Pure, never raises on the bytes.

The value is one record, WARC/1.0 or 1.1 (any `WARC/x.y`, as replay reads), plain or one
gzip member, as a WARC-writing fetcher emits it. The record is framed by replay's lenient
reader (lenient.py `frames`) and converted by the same code as replay's records
(archive_record.py `convert`): a response or resource record is a page, a revisit is
decided as a recrawl, request, metadata, warcinfo and the rest are Skipped (counted, not
decided, their offsets committed).

One record a message: a second record (or gzip member) after it rejects the message as
`multiple-records` rather than deciding the first and dropping the rest unseen; the dead
letter keeps the value whole, and `replay` reads it as a file.

Bad input, each a reject kind and a dead letter with the value as it came:
    not-warc          neither a WARC record nor a gzip member
    bad-gzip          a gzip member that does not inflate, or is followed by junk
    truncated         the gzip member or the record ends before its Content-Length
    bad-record        a WARC header without a valid Content-Length, or a record followed
                      by bytes that are not a record (its Content-Length too small?)
    no-url            a page or revisit record without WARC-Target-URI
    bad-http          a response block that is not an HTTP response (or bad-encoding...)
    too-large         the record inflates past max_bytes
    multiple-records  more than one record
"""

from __future__ import annotations

import dataclasses
import io
import zlib

from stream_dedup.models import Page, Rejected, Skipped
from stream_dedup.sources.archive_record import GZIP_MAGIC, Frame, convert
from stream_dedup.sources.lenient import Cursor, frames


def page_from_warc(value: bytes, source: str, *, max_bytes: int,
                   position: int | None = None) -> Page | Rejected | Skipped:
    """The record in `value` as replay would give it, with `source` and `position` set;
    a Rejected carries `value` whole as its raw bytes."""
    data, broken = value, None
    if value.startswith(GZIP_MAGIC[:2]):
        data, broken = _gunzip(value, max_bytes)
    is_record = data.lstrip(b"\r\n").startswith(b"WARC/")
    if broken is not None and (broken.kind != "truncated" or not is_record):
        return dataclasses.replace(broken, source=source, raw=value)
    if not is_record:
        what = "a gzip member that holds " if data is not value else ""
        return Rejected(None, "not-warc", f"{what}not a WARC record: it starts with "
                        f"{data[:40]!r} (--input-format warc: one WARC record a message)",
                        source, value)
    items = frames(Cursor(io.BytesIO(data), 0, "in the message"), "warc")
    first = next(items)  # the value starts with a record line, so there is one
    if broken is not None:  # a gzip member cut short: its record's URL, if it got that far
        return dataclasses.replace(broken, url=first.url, source=source, raw=value)
    if isinstance(first, Frame):
        out = convert(first, source)
    else:
        out = dataclasses.replace(first, source=source)
    extra = next(items, None)
    if isinstance(extra, Frame):
        return Rejected(first.url, "multiple-records", "the record is followed by another: "
                        "one record a message (replay reads a file of many)", source, value)
    if extra is not None:
        return Rejected(first.url, "bad-record", f"the record is followed by bytes that are "
                        f"not a record (a wrong Content-Length?): {extra.message}", source,
                        value)
    if isinstance(out, Rejected):
        return dataclasses.replace(out, raw=value)
    if isinstance(out, Page) and position is not None:
        return dataclasses.replace(out, position=position)
    return out


def _gunzip(value: bytes, max_bytes: int) -> tuple[bytes, Rejected | None]:
    """One gzip member, inflated to at most `max_bytes` plus a response's headers, and what
    is wrong with it (a member cut short still gives what it holds)."""
    decoder = zlib.decompressobj(31)
    limit = max_bytes + (1 << 16)
    try:
        data = decoder.decompress(value, limit)
    except zlib.error as exc:
        return b"", Rejected(None, "bad-gzip", f"the gzip member does not inflate ({exc})")
    if decoder.unconsumed_tail:
        return b"", Rejected(None, "too-large", f"the record inflates past {limit} bytes "
                             f"(max_page_bytes={max_bytes}, plus 64 KiB of headers)")
    if not decoder.eof:
        return data, Rejected(None, "truncated", f"the gzip member ends early ({len(value)} "
                              f"bytes give {len(data)}): the message was cut short")
    rest = decoder.unused_data.lstrip(b"\x00")
    if rest.startswith(GZIP_MAGIC[:2]):
        return b"", Rejected(None, "multiple-records", f"the gzip member is followed by "
                             f"another ({len(rest)} bytes): one record a message (replay "
                             "reads a file of many)")
    if rest:
        return b"", Rejected(None, "bad-gzip", f"the gzip member is followed by {len(rest)} "
                             f"bytes that are not gzip data: {rest[:40]!r}")
    return data, None
