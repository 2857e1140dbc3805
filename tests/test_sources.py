"""Input readers on archives the tests write themselves (warcgen), plus the real corpus.

The corpus test reads every WARC/ARC file under ../shared/corpora/warc and compares the
number of HTML pages per file with html_index.tsv (made with warcio and custom readers);
it skips when the corpus is absent.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import gzip
import hashlib
import json
import random
import tempfile
import zlib
from collections import Counter
from pathlib import Path

import pytest
from fastwarc.warc import ArchiveIterator, WarcRecordType
from hypothesis import given, settings
from hypothesis import strategies as st
from warcgen import (
    Resp,
    arc_record,
    arc_response,
    http_block,
    metadata,
    request,
    response,
    revisit,
    warc_record,
    warcinfo,
    write_arc,
    write_warc,
)

from stream_dedup.errors import PageError
from stream_dedup.models import Page, Rejected
from stream_dedup.sources import warc
from stream_dedup.sources.files import input_kind, iter_inputs
from stream_dedup.sources.http_response import dechunk, decode_body, is_html, parse_response
from stream_dedup.sources.jsonl import iter_jsonl, page_from_json
from stream_dedup.sources.stats import SourceStats
from stream_dedup.sources.warc import iter_archive

HTML = b"<!DOCTYPE html><html><head><title>t</title></head><body>" + b"word " * 300 + b"</body>"
CORPUS = Path(__file__).parents[2] / "shared" / "corpora" / "warc"
ARCHIVES = (".warc", ".warc.gz", ".arc", ".arc.gz")


def words(n: int, seed: int = 0) -> bytes:
    """HTML that does not compress to nothing, so cuts land where a test wants them."""
    rng = random.Random(seed)
    return b"<html><body>" + b" ".join(b"w%d" % rng.randrange(10**6) for _ in range(n))


def pages(items: list[Page | Rejected]) -> list[Page]:
    """The pages with a payload (not revisit records)."""
    return [item for item in items if isinstance(item, Page) and item.revisit is None]


def rejects(items: list[Page | Rejected]) -> list[Rejected]:
    return [item for item in items if isinstance(item, Rejected)]


# --- http ----------------------------------------------------------------------------------------


def test_parse_response_is_lenient() -> None:
    block = b"HTTP/1.0 404\nContent-Type: text/html\nX-Long: a\n  b\nno colon here\n\n<p>x"
    resp = parse_response(block)
    assert (resp.status, resp.reason, resp.body) == (404, "", b"<p>x")
    assert resp.headers == (("Content-Type", "text/html"), ("X-Long", "a b"))
    assert parse_response(b"HTTP/1.1 200 OK\r\nA: 1").body == b""  # no end of headers


def test_parse_response_needs_a_status_line() -> None:
    with pytest.raises(PageError) as err:
        parse_response(b"<html>no headers</html>")
    assert err.value.kind == "bad-http"


@pytest.mark.parametrize(
    ("content_type", "expected"),
    [
        ("text/html", True),
        ("TEXT/HTML; charset=UTF-8", True),
        (" text/html ;q", True),
        ("application/xhtml+xml", True),
        ("text/plain", False),
        ("", False),
        (None, False),
        ("text/htmlx", False),
    ],
)
def test_is_html(content_type: str | None, expected: bool) -> None:
    assert is_html(content_type) is expected


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "deflate", "raw-deflate", "br", None])
@pytest.mark.parametrize("chunked", [False, True])
def test_decode_body_undoes_codings(coding: str | None, chunked: bool) -> None:
    resp = parse_response(
        http_block(Resp("http://a/", HTML, content_encoding=coding, chunked=chunked))
    )
    assert decode_body(resp.body, resp.headers) == HTML


def test_claimed_chunked_and_gzip_but_stored_plain() -> None:
    # Common Crawl 2008: both codings declared, the payload already plain.
    headers = (("Transfer-Encoding", "chunked"), ("Content-Encoding", "gzip"))
    assert decode_body(HTML, headers) == HTML
    assert dechunk(b"cafe\nnot chunked at all") is None  # hex word, but no CRLF chunk line


def test_truncated_codings_keep_the_prefix() -> None:
    body = words(2000)
    inflated = decode_body(gzip.compress(body)[:-200], (("Content-Encoding", "gzip"),))
    assert len(inflated) > len(body) // 2 and body.startswith(inflated)
    chunks = http_block(Resp("http://a/", body, chunked=True)).split(b"\r\n\r\n", 1)[1]
    dechunked = dechunk(chunks[:500]) or b""
    assert len(dechunked) > 200 and body.startswith(dechunked)
    assert decode_body(b"", (("Content-Encoding", "gzip"),)) == b""  # 204s, HEADs, empty pages


def test_undecodable_body_is_bad_encoding_unless_it_is_html() -> None:
    junk = bytes(random.Random(1).randrange(256) for _ in range(300))
    for coding in ("gzip", "br", "deflate", "compress"):
        with pytest.raises(PageError) as err:
            decode_body(b"\x00" + junk, (("Content-Encoding", coding),))
        assert err.value.kind == "bad-encoding"
        assert decode_body(HTML, (("Content-Encoding", coding),)) == HTML


# --- warc --------------------------------------------------------------------------------------


def mixed_records() -> list[bytes | Resp]:
    return [
        warcinfo(),
        request("http://a.example/"),
        Resp("http://a.example/", HTML, headers=[("Server", "t")]),
        metadata("http://a.example/"),
        Resp("http://a.example/logo.png", b"\x89PNG....", content_type="image/png"),
        revisit("http://a.example/"),
        Resp("http://a.example/missing", b"<html>gone</html>", status=404),
        Resp("http://a.example/x", b"<html/>", content_type="Application/XHTML+XML; q=1"),
        Resp("http://a.example/empty", b""),
        Resp("http://a.example/notype", b"<html/>", content_type=None),
    ]


@pytest.mark.parametrize("gzip_records", [True, False])
def test_warc_pages_skips_and_stats(tmp_path: Path, gzip_records: bool) -> None:
    path = write_warc(tmp_path / "c.warc.gz", mixed_records(), gzip_records=gzip_records)
    stats = SourceStats()
    items = list(iter_archive(path, stats))
    assert rejects(items) == []
    got = {p.url: p for p in pages(items)}
    assert list(got) == [
        "http://a.example/",
        "http://a.example/missing",
        "http://a.example/x",
        "http://a.example/empty",
    ]
    home = got["http://a.example/"]
    assert (home.body, home.status, home.source) == (HTML, 200, "c.warc.gz#2")
    assert home.fetched_at == "2024-01-02T03:04:05Z"
    assert home.header("server") == "t"
    assert (home.header("content-type") or "").startswith("text/html")
    assert got["http://a.example/missing"].status == 404
    assert got["http://a.example/empty"].body == b""
    (again,) = [i for i in items if isinstance(i, Page) and i.revisit is not None]
    assert (again.url, again.body, again.source) == ("http://a.example/", b"", "c.warc.gz#5")
    assert again.revisit is not None and again.revisit.profile.endswith("identical-payload-digest")
    assert stats.to_dict() == {
        "files": 1,
        "records": 10,
        "pages": 4,
        "non_2xx": 1,
        "revisits": 1,
        "skipped": {"warcinfo": 1, "request": 1, "metadata": 1, "non-html": 2},
        "rejected": {},
        "unreadable": [],
        "repeated": [],
        "unsplit": [],
    }


def test_warc_bodies_are_decoded(tmp_path: Path) -> None:
    resps = [Resp(f"http://a/{c}", HTML, content_encoding=c) for c in ("gzip", "deflate", "br")]
    resps += [
        Resp("http://a/c", HTML, chunked=True),
        Resp("http://a/cl", HTML, claim_chunked=True),
        Resp("http://a/cg", HTML, chunked=True, content_encoding="x-gzip"),
    ]
    items = list(iter_archive(write_warc(tmp_path / "e.warc.gz", resps)))
    assert [p.body for p in pages(items)] == [HTML] * len(resps)


def test_fast_reader_and_lenient_reader_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_warc(tmp_path / "c.warc.gz", mixed_records())
    fast = list(iter_archive(path))
    monkeypatch.setattr(warc, "warc_items", lambda p: warc.lenient_items(p, "warc"))
    assert list(iter_archive(path)) == fast


@pytest.mark.parametrize("reader", ["fast", "lenient"])
def test_big_non_html_records_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reader: str
) -> None:
    if reader == "lenient":
        monkeypatch.setattr(warc, "warc_items", lambda p: warc.lenient_items(p, "warc"))
    video = random.Random(3).randbytes(300_000)
    big_html = words(40_000)  # > the 64 KiB head: read whole
    records = [
        Resp("http://a/v.mp4", video, content_type="video/mp4"),
        Resp("http://a/big", big_html),
        Resp("http://a/v2.mp4", video, content_type="video/mp4"),
    ]
    path = write_warc(tmp_path / "v.warc.gz", records)
    stats = SourceStats()
    assert [p.body for p in pages(list(iter_archive(path, stats)))] == [big_html]
    assert stats.skipped == Counter({"non-html": 2})
    path.write_bytes(path.read_bytes()[:-1000])
    assert [(r.kind, r.url) for r in rejects(list(iter_archive(path)))] == [
        ("truncated", "http://a/v2.mp4")
    ]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=300),
            st.sampled_from([None, "gzip", "br", "deflate"]),
            st.booleans(),
            st.sampled_from([200, 301, 500]),
        ),
        min_size=1,
        max_size=6,
    ),
    st.booleans(),
)
def test_written_pages_come_back(
    specs: list[tuple[bytes, str | None, bool, int]], gzip_records: bool
) -> None:
    resps = [
        Resp(
            f"http://h/{i}",
            b"<html>" + body,
            content_encoding=coding,
            chunked=chunked,
            status=status,
        )
        for i, (body, coding, chunked, status) in enumerate(specs)
    ]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_warc(Path(tmp) / "p.warc", resps, gzip_records=gzip_records)
        got = list(iter_archive(path))
    assert [(p.url, p.body, p.status) for p in pages(got)] == [
        (r.url, r.body, r.status) for r in resps
    ]


def test_warc_versions_and_lf_only_headers(tmp_path: Path) -> None:
    rec = response(Resp("http://a/", HTML), version="1.0")
    head, block = rec.split(b"\r\n\r\n", 1)
    lf_only = head.replace(b"\r\n", b"\n") + b"\n\n" + block
    path = write_warc(tmp_path / "v.warc", [rec, lf_only], gzip_records=False)
    assert [p.body for p in pages(list(iter_archive(path)))] == [HTML, HTML]


def test_single_gzip_member_warc_018(tmp_path: Path) -> None:
    # ClueWeb09 style: WARC/0.18, the whole file one gzip member.
    data = b"".join(response(Resp(f"http://a/{i}", HTML), version="0.18") for i in range(3))
    path = tmp_path / "cw.warc.gz"
    path.write_bytes(gzip.compress(data))
    items = list(iter_archive(path))
    assert [p.source for p in pages(items)] == ["cw.warc.gz#0", "cw.warc.gz#1", "cw.warc.gz#2"]


@pytest.mark.parametrize("gzip_records", [True, False])
def test_truncated_file(tmp_path: Path, gzip_records: bool) -> None:
    resps = [Resp(f"http://a/{i}", words(3000, seed=i)) for i in range(4)]
    path = write_warc(tmp_path / "t.warc.gz", resps, gzip_records=gzip_records)
    whole = path.read_bytes()
    path.write_bytes(whole[:-1000])  # inside the last block
    items = list(iter_archive(path))
    assert [p.body for p in pages(items)] == [r.body for r in resps[:3]]
    assert [(r.kind, r.url, r.source) for r in rejects(items)] == [
        ("truncated", "http://a/3", "t.warc.gz#3")
    ]
    assert "the input ends early" in rejects(items)[0].message
    last = len(whole) - len(
        write_warc(tmp_path / "x", resps[3:], gzip_records=gzip_records).read_bytes()
    )
    path.write_bytes(whole[: last + (30 if gzip_records else 60)])  # inside the last header
    (bad,) = rejects(list(iter_archive(path)))
    assert (bad.kind, bad.source) == ("truncated", "t.warc.gz#3")


@pytest.mark.parametrize("gzip_records", [True, False])
def test_garbage_between_records(tmp_path: Path, gzip_records: bool) -> None:
    path = write_warc(
        tmp_path / "g.warc.gz",
        [Resp(f"http://a/{i}", HTML) for i in range(2)],
        gzip_records=gzip_records,
    )
    tail = write_warc(tmp_path / "tail", [Resp("http://a/2", HTML)], gzip_records=gzip_records)
    path.write_bytes(path.read_bytes() + b"junk line\r\nmore junk\r\n" + tail.read_bytes())
    items = list(iter_archive(path))
    assert [p.url for p in pages(items)] == ["http://a/0", "http://a/1", "http://a/2"]
    assert [r.kind for r in rejects(items)] == ["bad-record"]


def test_corrupt_gzip_member_is_skipped(tmp_path: Path) -> None:
    members = [gzip.compress(response(Resp(f"http://a/{i}", HTML))) for i in range(3)]
    broken = bytearray(members[1])
    broken[30:50] = b"X" * 20
    path = tmp_path / "z.warc.gz"
    path.write_bytes(members[0] + bytes(broken) + members[2] + b"\0" * 64)  # + zero padding
    items = list(iter_archive(path))
    assert [p.url for p in pages(items)] == ["http://a/0", "http://a/2"]
    assert [r.kind for r in rejects(items)] == ["bad-record"]
    assert "corrupt gzip member" in rejects(items)[0].message


def test_wrong_content_length_resyncs(tmp_path: Path) -> None:
    liar = warc_record(
        "response",
        http_block(Resp("http://a/liar", HTML)),
        url="http://a/liar",
        length=len(HTML) + 400,
    )  # swallows the start of the next record
    records = [
        response(Resp("http://a/0", HTML)),
        liar,
        response(Resp("http://a/1", HTML)),
        response(Resp("http://a/2", HTML)),
    ]
    items = list(iter_archive(write_warc(tmp_path / "l.warc", records, gzip_records=False)))
    assert [p.url for p in pages(items)][-1] == "http://a/2"
    assert [r.kind for r in rejects(items)] == ["bad-record"]


def test_bad_records_are_rejected_and_reading_goes_on(tmp_path: Path) -> None:
    bad_gzip = Resp("http://a/bad", b"\x00\x01binary", headers=[("Content-Encoding", "gzip")])
    no_http = warc_record(
        "response",
        b"\x00garbage",
        url="http://a/nohttp",
        content_type="application/http; msgtype=response",
    )
    records: list[bytes | Resp] = [bad_gzip, no_http, Resp("http://a/ok", HTML)]
    items = list(iter_archive(write_warc(tmp_path / "b.warc.gz", records)))
    assert [(r.kind, r.url, r.source) for r in rejects(items)] == [
        ("bad-encoding", "http://a/bad", "b.warc.gz#0"),
        ("bad-http", "http://a/nohttp", "b.warc.gz#1"),
    ]
    assert rejects(items)[0].raw is not None
    assert [p.url for p in pages(items)] == ["http://a/ok"]


def test_wayback_style_record(tmp_path: Path) -> None:
    # HTTP headers inside the WARC header block; the block is the bare HTML body.
    rec = warc_record(
        "response",
        HTML,
        url="http://web.archive.org/web/1/http://a/",
        date="null",
        content_type="text/html; charset=utf-8",
        headers=[("X-Archive-Orig-Server", "IIS")],
    )
    (page,) = pages(list(iter_archive(write_warc(tmp_path / "w.warc.gz", [rec]))))
    assert (page.body, page.status, page.fetched_at) == (HTML, None, None)
    assert page.header("X-Archive-Orig-Server") == "IIS" and page.header("WARC-Type") is None


@pytest.mark.parametrize(
    "content", [b"", b"just some text\n", b"\x1f\x8bnot really gzip", bytes(range(256)) * 4]
)
def test_garbage_file_is_one_unreadable_reject(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.warc.gz"
    path.write_bytes(content)
    stats = SourceStats()
    items = list(iter_archive(path, stats))
    assert [(r.kind, r.source) for r in rejects(items)] == [("unreadable-file", "junk.warc.gz#0")]
    assert stats.rejected == Counter({"unreadable-file": 1}) and stats.pages == 0


def test_missing_file(tmp_path: Path) -> None:
    items = list(iter_archive(tmp_path / "nope.warc"))
    assert [r.kind for r in rejects(items)] == ["unreadable-file"] and len(items) == 1


# --- arc ---------------------------------------------------------------------------------------


def test_arc_v1_without_separators(tmp_path: Path) -> None:
    quirk = Resp(
        "http://cc.example/q",
        HTML,
        headers=[("Transfer-Encoding", "chunked"), ("Content-Encoding", "gzip")],
    )
    records: list[bytes | Resp] = [
        Resp("http://cc.example/", HTML),
        arc_record(
            "dns:cc.example", b"20080509190241\ncc.example. 60 IN A 192.0.2.1\n", mime="text/dns"
        ),
        Resp("http://cc.example/a.css", b"p{}", content_type="text/css"),
        quirk,
        Resp("http://cc.example/gone", b"<html>404</html>", status=404),
    ]
    path = write_arc(tmp_path / "cc.arc", records, separators=False)
    stats = SourceStats()
    got = pages(list(iter_archive(path, stats)))
    assert [(p.url, p.body, p.status, p.source) for p in got] == [
        ("http://cc.example/", HTML, 200, "cc.arc#1"),
        ("http://cc.example/q", HTML, 200, "cc.arc#4"),
        ("http://cc.example/gone", b"<html>404</html>", 404, "cc.arc#5"),
    ]
    assert got[0].fetched_at == "2008-04-30T20:48:26Z"
    assert stats.skipped == Counter({"warcinfo": 1, "non-html": 2})


def test_arc_gzipped_with_separators_and_truncated(tmp_path: Path) -> None:
    path = write_arc(
        tmp_path / "a.arc.gz", [Resp(f"http://a/{i}", HTML) for i in range(3)], gzip_records=True
    )
    assert len(pages(list(iter_archive(path)))) == 3
    plain = write_arc(tmp_path / "b.arc", [Resp(f"http://a/{i}", HTML) for i in range(3)])
    plain.write_bytes(plain.read_bytes()[:-100])
    items = list(iter_archive(plain))
    assert len(pages(items)) == 2 and [r.kind for r in rejects(items)] == ["truncated"]


# --- jsonl -------------------------------------------------------------------------------------


def test_page_from_json_html_and_base64() -> None:
    page = page_from_json(
        '{"url": "http://a/", "html": "<p>é</p>", "status": 404, '
        '"fetched_at": "2024-01-01T00:00:00Z"}',
        "k#1",
    )
    assert (page.body, page.status, page.source) == ("<p>é</p>".encode(), 404, "k#1")
    assert page.header("Content-Type") == "text/html; charset=utf-8"
    raw = base64.b64encode(b"\xff<html>").decode()
    for value in (raw, raw.rstrip("="), raw[:4] + "\n" + raw[4:]):
        data = json.dumps({"url": "u", "body_b64": value, "headers": [["A", "1"]]}).encode()
        page = page_from_json(data, None)
        assert page.body == b"\xff<html>" and page.headers == (("A", "1"),)
    page = page_from_json(b'{"url": "u", "html": "", "headers": {"content-type": "text/x"}}', None)
    assert page.body == b"" and page.headers == (("Content-Type", "text/html; charset=utf-8"),)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("not json", "bad-json"),
        ("[1]", "bad-json"),
        (b"\xff\xfe{", "bad-json"),
        ('{"html": "x"}', "no-url"),
        ('{"url": " ", "html": "x"}', "no-url"),
        ('{"url": 5, "html": "x"}', "no-url"),
        ('{"url": "u"}', "no-body"),
        ('{"url": "u", "body_b64": "@@@"}', "bad-base64"),
        ('{"url": "u", "body_b64": 5}', "bad-base64"),
        ('{"url": "u", "html": "x", "status": "200"}', "bad-field"),
        ('{"url": "u", "html": "x", "status": true}', "bad-field"),
        ('{"url": "u", "html": "x", "fetched_at": 5}', "bad-field"),
        ('{"url": "u", "html": "x", "headers": "A: 1"}', "bad-field"),
        ('{"url": "u", "html": "x", "headers": [["A"]]}', "bad-field"),
        ('{"url": "u", "html": "x", "headers": {"A": 1}}', "bad-field"),
        ('{"url": "u", "html": 5}', "bad-field"),
        ("[" * 200_000, "bad-json"),  # deeper than any JSON parser recurses
        ('{"url": "u", "html": "x", "status": 123456789012345678901234567890}', "bad-field"),
    ],
)
def test_page_from_json_errors(line: str | bytes, kind: str) -> None:
    with pytest.raises(PageError) as err:
        page_from_json(line, None)
    assert err.value.kind == kind


def test_page_from_json_takes_what_the_standard_library_takes() -> None:
    """orjson and pybase64 go first; what they refuse the standard library still reads."""
    lone = page_from_json('{"url": "u", "html": "a\\ud800b"}')
    assert lone.body == b"a?b"
    nan = page_from_json('{"url": "u", "html": "x", "extra": NaN}')
    assert nan.body == b"x"
    raw = bytes(range(256)) * 3 + b"x"  # 769 bytes: the encoding ends in "=="
    for value in (base64.urlsafe_b64encode(raw).decode(), base64.b64encode(raw).decode()[:-2],
                  " ".join(base64.b64encode(raw).decode())):
        assert page_from_json(json.dumps({"url": "u", "body_b64": value})).body == raw


def test_iter_jsonl_goes_on_after_bad_lines(tmp_path: Path) -> None:
    lines = [
        '{"url": "http://a/1", "html": "<p>1</p>"}',
        "",
        "{oops",
        '{"url": "http://a/3", "body_b64": "!!"}',
        "   ",
        '{"url": "http://a/5", "html": "<p>5</p>", "status": 500}',
    ]
    for name, opener in (("p.jsonl", open), ("p.jsonl.gz", gzip.open)):
        with opener(tmp_path / name, "wt") as out:
            out.write("\r\n".join(lines))
        stats = SourceStats()
        items = list(iter_jsonl(tmp_path / name, stats))
        assert [(p.url, p.source) for p in pages(items)] == [
            ("http://a/1", f"{name}#1"),
            ("http://a/5", f"{name}#6"),
        ]
        bad = rejects(items)
        assert [(r.kind, r.url, r.source, r.raw) for r in bad] == [
            ("bad-json", None, f"{name}#3", b"{oops"),
            ("bad-base64", "http://a/3", f"{name}#4", lines[3].encode()),
        ]
        assert (stats.records, stats.pages, stats.non_2xx) == (4, 2, 1)


def test_iter_jsonl_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(b"".join(b'{"url": "u%d", "html": "<p/>"}\n' % i for i in range(500)))
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    items = list(iter_jsonl(path))
    assert pages(items) and [r.kind for r in rejects(items)][-1:] == ["truncated"]


# --- files -------------------------------------------------------------------------------------


def test_iter_inputs_dispatches_in_order(tmp_path: Path) -> None:
    warc_file = write_warc(tmp_path / "a.warc.gz", [Resp("http://w/", HTML)])
    renamed = write_warc(tmp_path / "crawl.dat", [Resp("http://w/dat", HTML)])
    arc = write_arc(tmp_path / "b.arc.gz", [Resp("http://arc/", HTML)], gzip_records=True)
    (tmp_path / "c.ndjson").write_text('{"url": "http://j/", "html": "<p/>"}\n')
    (tmp_path / "d.txt").write_text('\n{"url": "http://txt/", "html": "<p/>"}\n')
    (tmp_path / "e.bin").write_bytes(zlib.compress(b"neither"))
    paths = [
        warc_file,
        tmp_path / "missing.jsonl",
        renamed,
        arc,
        tmp_path / "c.ndjson",
        tmp_path / "d.txt",
        tmp_path / "e.bin",
        tmp_path,
    ]
    stats = SourceStats()
    items = list(iter_inputs(paths, stats))
    assert [(type(i).__name__, i.url, i.source) for i in items] == [
        ("Page", "http://w/", f"{tmp_path}/a.warc.gz#0"),
        ("Rejected", None, f"{tmp_path}/missing.jsonl#0"),
        ("Page", "http://w/dat", f"{tmp_path}/crawl.dat#0"),
        ("Page", "http://arc/", f"{tmp_path}/b.arc.gz#1"),
        ("Page", "http://j/", f"{tmp_path}/c.ndjson#1"),
        ("Page", "http://txt/", f"{tmp_path}/d.txt#2"),
        ("Rejected", None, f"{tmp_path}/e.bin#0"),
        ("Rejected", None, f"{tmp_path}#0"),
    ]
    assert "no such file" in rejects(items)[0].message
    assert (stats.files, stats.pages, stats.rejected) == (8, 5, Counter({"unreadable-file": 3}))
    assert input_kind(renamed) == "archive" and input_kind(tmp_path / "d.txt") == "jsonl"


# --- the real corpus ---------------------------------------------------------------------------


def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.name.endswith(ARCHIVES))


def corpus_index() -> dict[str, list[dict[str, str]]]:
    index: dict[str, list[dict[str, str]]] = {}
    with open(CORPUS / "html_index.tsv", newline="") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            index.setdefault(row["file"].removeprefix("./"), []).append(row)
    return index


def html_resources(path: Path) -> int:
    """HTML resource records of a WARC file, as FastWARC reads it (0 for what it cannot)."""
    if ".warc" not in path.name:
        return 0
    found = 0
    with open(path, "rb") as fh, contextlib.suppress(Exception):
        for record in ArchiveIterator(fh, parse_http=False,
                                      record_types=WarcRecordType.resource):
            found += is_html(record.headers.get("Content-Type"))
    return found


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpora/warc is absent")
def test_corpus_pages_match_the_index() -> None:
    """Every file reads without an exception; page counts agree with html_index.tsv.

    A difference must be explained by Rejected records of that file (e.g. the clipped record
    of resiliparse/clipped.warc.gz, which the index counts as a page and we reject as
    truncated), or by HTML `resource` records, which are pages here and not in the index (it
    lists response records; they are counted with FastWARC here, not with our reader).
    Bodies must hash like the index's except for the Wayback snapshots, whose index rows
    come from a custom reader that rewrote the bodies.
    """
    index = corpus_index()
    files = corpus_files()
    assert len(files) >= 50
    unexplained, report = [], []
    matched = compared = 0
    for path in files:
        rel = path.relative_to(CORPUS).as_posix()
        stats = SourceStats()
        items = list(iter_archive(path, stats, name=rel))
        assert stats.records > 0 and all(isinstance(i, Page | Rejected) for i in items)
        ours, rows = pages(items), index.get(rel, [])
        bad = rejects(items)
        line = f"{rel}: pages {len(ours)} index {len(rows)} rejected {dict(stats.rejected)}"
        if len(ours) != len(rows) or bad:
            report.append(line + "".join(f"\n    {r.source} {r.kind}: {r.message}" for r in bad))
        if abs(len(ours) - len(rows) - html_resources(path)) > len(bad):
            unexplained.append(line)
        digests = Counter(hashlib.sha1(p.body).hexdigest() for p in ours)
        checked = Counter(r["sha1_decoded"] for r in rows if r["note"] != "wayback-nonstandard")
        compared += sum(checked.values())
        matched += sum((digests & checked).values())
    print("\n".join(report))
    assert not unexplained, "\n".join(unexplained)
    total = sum(len(rows) for rows in index.values())
    print(f"sha1 agreement {matched}/{compared}; index rows {total}")
    assert matched >= 0.99 * compared


@pytest.mark.corpus
@pytest.mark.skipif(not CORPUS.is_dir(), reason="../shared/corpora/warc is absent")
def test_corpus_fast_and_lenient_readers_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [p for p in corpus_files() if ".warc" in p.name]
    fast = [list(iter_archive(p)) for p in files]
    monkeypatch.setattr(warc, "warc_items", lambda p: warc.lenient_items(p, "warc"))
    assert [list(iter_archive(p)) for p in files] == fast


def test_arc_response_helper_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "one.arc"
    path.write_bytes(arc_response(Resp("http://one/", HTML)))  # no filedesc: still an ARC
    assert [p.url for p in pages(list(iter_archive(path)))] == ["http://one/"]


def test_page_records_read_whole_up_to_a_bound_and_big_non_html_ones_not(tmp_path: Path) -> None:
    """A page record up to WHOLE is read at once; past it, its head first: an HTML page is
    then read whole, a video only as far as its head (it need not sit in RAM)."""
    from stream_dedup.sources.archive_record import HEAD
    from stream_dedup.sources.fastwarc_reader import WHOLE, warc_items

    filler = b"<p>" + b"word " * (WHOLE // 4) + b"</p>"
    middle = b"<html><body>" + filler[: 3 * HEAD] + b"</body></html>"
    big = b"<html><body>" + filler + b"</body></html>"
    video = bytes(random.Random(7).randbytes(WHOLE + HEAD))
    path = write_warc(tmp_path / "sizes.warc.gz", [
        Resp("http://a.example/middle", middle), Resp("http://a.example/big", big),
        Resp("http://a.example/video", video, content_type="video/mp4")])
    frames = {f.url: f for f in warc_items(path) if not isinstance(f, Rejected)}
    assert frames["http://a.example/middle"].block.endswith(middle)
    assert frames["http://a.example/big"].length > WHOLE
    assert frames["http://a.example/big"].block.endswith(big)
    assert len(frames["http://a.example/video"].block) == HEAD
    assert not any(f.truncated for f in frames.values())
    pages = {p.url: p for p in warc.iter_archive(path) if isinstance(p, Page)}
    assert set(pages) == {"http://a.example/middle", "http://a.example/big"}
    assert pages["http://a.example/big"].body == big
