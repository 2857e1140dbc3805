"""All the input files of a replay, one after the other, as one stream of Pages and Rejects.

The extension picks the reader (.warc[.gz], .arc[.gz], .jsonl[.gz], .ndjson[.gz]); anything
else is sniffed from its first bytes, because crawl dumps are often renamed (.dat, .gz, no
extension at all). A file that is missing, empty or cannot be read becomes one "unreadable-file"
Rejected and the replay goes on with the next file: one bad path must not cost a night's run
(the summary names it, and `replay` exits non-zero unless told to accept it).
A file given twice (the same path, overlapping globs, a symlink to it) is read once: reading
it again would only decide every page as a copy of itself. A copy under another name is
another file, and its pages are exact duplicates.
The runner's source for `replay` over them is replay/run.py FileSource. With a namespace field
(--namespace-field), a JSONL line names its page's namespace as a JSON message does
(namespace_field.py); archives name none.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stream_dedup.models import Page, Rejected
from stream_dedup.sources.jsonl import iter_jsonl
from stream_dedup.sources.stats import SourceStats
from stream_dedup.sources.warc import archive_format, iter_archive, read_head

log = logging.getLogger("stream_dedup.replay")

InputKind = Literal["archive", "jsonl"]

_ARCHIVE_SUFFIXES = (".warc", ".warc.gz", ".arc", ".arc.gz")
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")


def input_kind(path: str | os.PathLike[str]) -> InputKind | None:
    """Which reader a file needs: by extension, else by its content; None if neither fits.

    Raises OSError if the content has to be sniffed and the file cannot be read.
    """
    lower = Path(path).name.lower()
    if lower.endswith(_ARCHIVE_SUFFIXES):
        return "archive"
    if lower.endswith(_JSONL_SUFFIXES):
        return "jsonl"
    head = read_head(Path(path))
    if archive_format(head) is not None:
        return "archive"
    if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        return "jsonl"
    return None


def iter_inputs(
    paths: Iterable[str | os.PathLike[str]], stats: SourceStats | None = None,
    namespace_field: str = "",
) -> Iterator[Page | Rejected]:
    """Pages and Rejected records of every file, in the order given.

    Sources are f"{path as given}#{n}": record ordinal for archives, line number for JSONL.
    Every "unreadable-file" Rejected is also noted in `stats.unreadable`.
    """
    stats = stats if stats is not None else SourceStats()
    for item in _inputs(paths, stats, namespace_field):
        if isinstance(item, Rejected) and item.kind == "unreadable-file":
            stats.unreadable.append(item.message)
        yield item


@dataclass(frozen=True, slots=True)
class Input:
    """A file to read: its path, the name its sources carry (as given), its reader."""

    path: Path
    name: str
    kind: InputKind


def _inputs(paths: Iterable[str | os.PathLike[str]], stats: SourceStats,
            namespace_field: str) -> Iterator[Page | Rejected]:
    for planned in plan_inputs(paths, stats):
        if isinstance(planned, Rejected):
            yield planned
        elif planned.kind == "archive":
            yield from iter_archive(planned.path, stats, name=planned.name)
        else:
            yield from iter_jsonl(planned.path, stats, name=planned.name,
                                  namespace_field=namespace_field)


def plan_inputs(paths: Iterable[str | os.PathLike[str]], stats: SourceStats,
                ) -> Iterator[Input | Rejected]:
    """The files to read, in order, each once, with its reader; an "unreadable-file"
    Rejected in the place of one that cannot be read (not yet noted in stats.unreadable)."""
    # A file by device and inode (symlinks and hard links included) -> the name it was
    # first given as.
    first_given: dict[tuple[int, int], str] = {}
    for item in paths:
        path = Path(item)
        try:
            if not path.is_file():
                why = "no such file" if not path.exists() else "not a regular file"
                yield _unreadable(stats, path, why)
                continue
            st = path.stat()
            first = first_given.get((st.st_dev, st.st_ino))
            if first is not None:
                stats.repeated.append(f"{item} (the same file as {first})")
                log.warning("%s is the same file as %s, given before: read once", item, first)
                continue
            first_given[(st.st_dev, st.st_ino)] = str(item)
            if st.st_size == 0:
                yield _unreadable(stats, path, "empty file")
                continue
            kind = input_kind(path)
        except OSError as exc:
            yield _unreadable(stats, path, str(exc))
            continue
        if kind is not None:
            yield Input(path, str(item), kind)
        else:
            yield _unreadable(
                stats,
                path,
                "not a WARC, ARC or JSONL file (unknown extension, "
                "and the first bytes are none of these)",
            )


def _unreadable(stats: SourceStats, path: Path, why: str) -> Rejected:
    stats.files += 1
    stats.rejected["unreadable-file"] += 1
    return Rejected(
        url=None, kind="unreadable-file", message=f"{path}: {why}", source=f"{path}#0"
    )
