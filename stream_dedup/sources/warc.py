"""Pages out of WARC and ARC files, for `stream-dedup replay`: the readers' records, converted
and counted.

    fastwarc_reader.py  WARC files: FastWARC, then the lenient reader for the tail
    lenient.py          ARC files, damaged WARC: the lenient reader      ──> Frame
    archive_record.py   Frame -> Page | Rejected | Skipped (also a Kafka message's record,
                        warc_message.py)
    here                which reader; record ordinals and `source`; SourceStats

Only HTTP responses with an HTML content type (and HTML resource records) become Pages;
every other record is counted in `SourceStats` and skipped. A broken record becomes a
`Rejected` and reading goes on; nothing raises out of `iter_archive` for bad data.
ARC always goes through the lenient reader (FastWARC reads none; on the two ARC files
warcio reads it takes 0.028 s to our reader's 0.018 s).
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from stream_dedup.models import Page, Rejected, Skipped
from stream_dedup.sources.archive_record import (
    GZIP_MAGIC,
    ArchiveFormat,
    Frame,
    convert,
)
from stream_dedup.sources.fastwarc_reader import warc_items
from stream_dedup.sources.lenient import arc_header, lenient_items
from stream_dedup.sources.stats import SourceStats

__all__ = ["ArchiveFormat", "archive_format", "convert_records",
           "iter_archive", "lenient_items", "read_head", "warc_items"]

_CHUNK = 1 << 16


def archive_format(head: bytes) -> ArchiveFormat | None:
    """WARC or ARC, judged from the first (decompressed) bytes of a file."""
    line = head.lstrip(b"\r\n").split(b"\n", 1)[0]
    if line.startswith(b"WARC/"):
        return "warc"
    return "arc" if arc_header(line + b"\n") is not None else None


def read_head(path: Path, size: int = 4096) -> bytes:
    """First `size` bytes of the file's content, gunzipped if needed (partial data is fine)."""
    with open(path, "rb") as fh:
        raw = fh.read(_CHUNK)
    if raw.startswith(GZIP_MAGIC[:2]):
        try:
            return zlib.decompressobj(31).decompress(raw, size)
        except zlib.error:
            return b""
    return raw[:size]


def iter_archive(
    path: str | os.PathLike[str], stats: SourceStats | None = None, *, name: str | None = None
) -> Iterator[Page | Rejected]:
    """Pages (and Rejected records) of one WARC/ARC file, gzipped or not, in file order.

    `source` is f"{name}#{n}", n the 0-based ordinal of the record in the file (all record
    types count); `name` defaults to the file name.
    """
    path = Path(path)
    name = name or path.name
    stats = stats if stats is not None else SourceStats()
    stats.files += 1
    try:
        fmt = archive_format(read_head(path))
    except OSError as exc:
        yield _unreadable(stats, f"cannot read {path}: {exc}", f"{name}#0")
        return
    if fmt is None:
        msg = f"{path} is neither WARC nor ARC (no 'WARC/' or ARC header line at the start)"
        yield _unreadable(stats, msg, f"{name}#0")
        return
    items = warc_items(path) if fmt == "warc" else lenient_items(path, "arc")
    yield from convert_records(items, stats, path, name)


def convert_records(items: Iterator[Frame | Rejected], stats: SourceStats, path: Path,
                    name: str | None, ordinals: list[int] | None = None,
                    ) -> Iterator[Page | Rejected]:
    """The records of a reader as Pages and Rejects (a skipped record gives nothing), each
    record counted with its 0-based ordinal n: `source` is f"{name}#{n}"; with `name` None
    it is None and each item's n is appended to `ordinals` (a part of a file numbers its
    records from 0, and the replay renumbers them; replay/parts.py)."""
    ordinal = 0
    try:
        for item in items:
            stats.records += 1
            source = None if name is None else f"{name}#{ordinal}"
            if isinstance(item, Frame):
                out = convert(item, source)
            else:
                out = dataclasses.replace(item, source=source)
            count(stats, out)
            if not isinstance(out, Skipped):
                if ordinals is not None:
                    ordinals.append(ordinal)
                yield out
            ordinal += 1
    except OSError as exc:  # the disk, not the data
        if ordinals is not None:
            ordinals.append(ordinal)
        yield _unreadable(stats, f"read error in {path}: {exc}",
                          None if name is None else f"{name}#{ordinal}")


def count(stats: SourceStats, item: Page | Rejected | Skipped) -> None:
    """One converted record in the replay summary's counts."""
    if isinstance(item, Skipped):
        stats.skipped[item.kind] += 1
    elif isinstance(item, Rejected):
        stats.rejected[item.kind] += 1
    elif item.revisit is not None:
        stats.revisits += 1
    else:
        stats.pages += 1
        if item.status is not None and not 200 <= item.status < 300:
            stats.non_2xx += 1


def _unreadable(stats: SourceStats, message: str, source: str | None) -> Rejected:
    stats.rejected["unreadable-file"] += 1
    return Rejected(url=None, kind="unreadable-file", message=message, source=source)
