#!/usr/bin/env python3
"""A big record-gzipped WARC built at run time from the corpus (never kept in the repo).

The HTML responses of ../shared/corpora/warc's record-gzipped WARC files (one gzip member
each; files with damage, several records in a member or LF-only headers left out), written
again and again until the file holds `min_bytes`, each a gzip member of its own as
crawlers write them. Round n puts its URLs on host `r{n}.<host>` (WARC-Target-URI), so no
page is a recrawl of another. That is the file of the issue (one 62 MB WARC of 10,204
real pages: the corpus's pages, 12 times): from the second round on, every body is an
exact copy, so a replay of it is mostly reading, gunzip and WARC parsing.

With `distinct`, round n also shifts the ASCII letters of the text between tags by n
places (bodies neither content-coded nor chunked, about 5 in 6 of them), so its pages are
new text of the same shape and size: what a crawl of new pages costs, analysis and all.

With `edited`, round n is a recrawl of the same URLs (no `r{n}.` host) in which 1 word in
100 of the text between tags is changed (the words at positions = n mod 100, their letters
shifted): the pages are near-duplicates of the first crawl's (J8 ~0.85), not copies, so
verification, record reads and containment run for most of them, as in a real recrawl of
documentation or news sites (issue 47).

    python bench/bigwarc.py OUT.warc.gz [--mb 62] [--distinct | --edited]
"""

from __future__ import annotations

import argparse
import re
import zlib
from collections.abc import Iterator
from pathlib import Path

from benchlib import warc_files
from fastwarc.warc import ArchiveIterator

from stream_dedup.models import Page
from stream_dedup.sources.warc import iter_archive

_URI = re.compile(rb"(?im)^(WARC-Target-URI:[ \t]*<?[a-z][a-z0-9+.-]*://)")
_TEXT = re.compile(rb">([^<]+)<")
_WORD = re.compile(rb"[A-Za-z]+")
_LOWER, _UPPER = b"abcdefghijklmnopqrstuvwxyz", b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def html_records() -> list[bytes]:
    """The decompressed records (one a member) of the corpus's HTML responses, in order."""
    out: list[bytes] = []
    for path in warc_files():
        data = path.read_bytes()
        if ".warc" not in path.name or data[:2] != b"\x1f\x8b":
            continue
        records = list(_members(data))
        with open(path, "rb") as fh:
            positions = [r.stream_pos for r in ArchiveIterator(fh, parse_http=False)]
        if [at for at, _ in records] != positions:
            continue  # damage, or not one member per record
        pages = {int(p.source.rpartition("#")[2]) for p in iter_archive(path)
                 if isinstance(p, Page) and p.source and p.revisit is None}
        out += [record for i, (_, record) in enumerate(records)
                if i in pages and b"\r\n\r\n" in record]
    return out


def _members(data: bytes) -> Iterator[tuple[int, bytes]]:
    at = 0
    while at < len(data):
        decoder = zlib.decompressobj(31)
        try:
            record = decoder.decompress(data[at:])
        except zlib.error:
            return
        if not decoder.eof:
            return
        yield at, record
        at = len(data) - len(decoder.unused_data)


def _rotated(text: bytes, n: int) -> bytes:
    return lettered(text, _LOWER[n:] + _LOWER[:n])


def lettered(text: bytes, lower: bytes) -> bytes:
    """`text` with the ASCII letters between tags replaced: a-z by `lower` (26 letters),
    A-Z by the same letters upper-cased; tags, lengths and the rest unchanged."""
    table = bytes.maketrans(_LOWER + _UPPER, lower + lower.upper())
    return _TEXT.sub(lambda m: b">" + m[1].translate(table) + b"<", text)


def edited(text: bytes, n: int) -> bytes:
    """`text` with 1 word in 100 between tags changed (the words at positions = n mod 100
    across the page, their letters shifted by n % 25 + 1); lengths unchanged."""
    count = 0
    table = bytes.maketrans(_LOWER + _UPPER, _LOWER[n % 25 + 1:] + _LOWER[:n % 25 + 1]
                            + (_LOWER[n % 25 + 1:] + _LOWER[:n % 25 + 1]).upper())

    def word(m: re.Match[bytes]) -> bytes:
        nonlocal count
        count += 1
        return m[0].translate(table) if count % 100 == n % 100 else m[0]

    return _TEXT.sub(lambda m: b">" + _WORD.sub(word, m[1]) + b"<", text)


def in_round(record: bytes, n: int, distinct: bool, edit: bool = False) -> bytes:
    """The record as round n writes it (round 0: as it is)."""
    if n == 0:
        return record
    head, _, block = record.partition(b"\r\n\r\n")
    if not edit:  # a recrawl keeps its URLs
        head = _URI.sub(rb"\1r%d." % n, head, count=1)
    if distinct or edit:
        http, sep, body = block.partition(b"\r\n\r\n")
        coded = re.search(rb"(?im)^(content-encoding:[ \t]*(?!identity)\S|"
                          rb"transfer-encoding:[ \t]*chunked)", http)
        if sep and coded is None:  # the letters move, the lengths do not
            body = edited(body, n) if edit else _rotated(body, n % 25 + 1)
            block = http + sep + body
    return head + b"\r\n\r\n" + block


def write(path: Path, min_bytes: int, distinct: bool = False, edit: bool = False
          ) -> tuple[int, int]:
    """Write the file; (rounds, records) written."""
    records = html_records()
    rounds = 0
    with open(path, "wb") as out:
        while out.tell() < min_bytes:
            for record in records:
                packer = zlib.compressobj(6, zlib.DEFLATED, 31)
                out.write(packer.compress(in_round(record, rounds, distinct, edit))
                          + packer.flush())
            rounds += 1
    return rounds, rounds * len(records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--mb", type=float, default=62)
    kind = ap.add_mutually_exclusive_group()
    kind.add_argument("--distinct", action="store_true")
    kind.add_argument("--edited", action="store_true")
    args = ap.parse_args()
    rounds, records = write(args.out, int(args.mb * 1e6), args.distinct, args.edited)
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.1f} MB, {rounds} rounds, "
          f"{records:,} HTML responses")


if __name__ == "__main__":
    main()
