"""Crawlers' JSON dialects and carried fields, pure: kafka/dialects.py, config's mappings,
Decision.carried, and the pipeline handing carried fields on (memory index, no broker)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stream_dedup import Settings
from stream_dedup.config_checks import carry_names, json_field_map
from stream_dedup.core.decode import decode_html
from stream_dedup.errors import ConfigError
from stream_dedup.kafka.dialects import CARRY_MAX_CHARS, dialect_for
from stream_dedup.kafka.messages import page_from_message
from stream_dedup.models import Decision, Page, Rejected
from stream_dedup.pipeline.deduplicator import Deduplicator
from stream_dedup.sources.jsonl import page_from_json

FIREHOSE: dict[str, Any] = {
    "url": "http://a.example/start", "response_url": "http://a.example/final",
    "status_code": 200, "status_msg": "OK", "body": "<p>Déjà vu, “quoted”</p>",
    "encoding": "utf-8",
    "response_headers": {"Content-Type": ["text/html"], "Set-Cookie": ["a=1", "b=2"]},
    "request_headers": {"Accept": ["text/html"]}, "timestamp": "2020-12-22T21:37:04.736926",
    "crawlid": "abc123", "appid": "testapp", "links": [], "attrs": None,
}


def read(msg: dict[str, Any] | bytes, fmt: str = "scrapy-cluster", **flags: str,
         ) -> Page | Rejected:
    value = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
    dialect = dialect_for(Settings(input_format=fmt, **flags))
    return page_from_message(value, b"http://key.example/", [], "t/0/5", input_format=fmt,
                             max_bytes=1 << 20, position=99, dialect=dialect)


def page(msg: dict[str, Any] | bytes, fmt: str = "scrapy-cluster", **flags: str) -> Page:
    item = read(msg, fmt, **flags)
    assert isinstance(item, Page), item
    return item


def test_a_firehose_message_is_the_page_scrapy_cluster_fetched() -> None:
    p = page(FIREHOSE)
    assert p.url == "http://a.example/final"  # where the content came from
    assert p.body == FIREHOSE["body"].encode("utf-8")
    assert p.status == 200 and p.fetched_at == "2020-12-22T21:37:04.736926"
    assert p.header("set-cookie") == "a=1"
    assert [v for n, v in p.headers if n == "Set-Cookie"] == ["a=1", "b=2"]
    assert p.header("content-type") == "text/html; charset=utf-8"
    assert (p.source, p.position, p.carried) == ("t/0/5", 99, ())
    assert page({**FIREHOSE, "response_url": None}).url == "http://a.example/start"


def test_the_body_is_stored_in_its_encoding_and_labelled_so() -> None:
    p = page({**FIREHOSE, "encoding": "cp1252"})
    assert p.body == FIREHOSE["body"].encode("cp1252")
    assert p.header("content-type") == "text/html; charset=cp1252"
    assert decode_html(p.body, p.header("content-type")) == FIREHOSE["body"]
    # a text its charset cannot hold (the crawler's replacement characters): UTF-8
    odd = page({**FIREHOSE, "encoding": "iso-8859-2", "body": "<p>\ufffd 日本</p>"})
    assert odd.body == "<p>\ufffd 日本</p>".encode() and "utf-8" in odd.header("content-type")
    # a charset only Python knows: stored as UTF-8, which the decoder reads
    assert page({**FIREHOSE, "encoding": "cp437"}).header("content-type").endswith("utf-8")
    assert page({**FIREHOSE, "encoding": None}).body == FIREHOSE["body"].encode()


WEB_CHARSETS = ["utf-8", "cp1252", "iso-8859-2", "koi8-r", "cp1251", "gb18030", "shift_jis",
                "euc-jp", "big5", "euc-kr", "windows-1256", "utf-16"]


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(exclude_categories=("Cs",)), max_size=60),
       st.sampled_from(WEB_CHARSETS))
@example(text="¥", encoding="euc-jp")  # Python's encoder writes "\\" for it
@example(text="Ã©", encoding="cp1252")  # its bytes are valid UTF-8 ("é")
def test_the_decoder_reads_back_the_text_the_crawler_sent(text: str, encoding: str) -> None:
    """Whatever the charset, the analysis decodes exactly the body text of the message."""
    html = f"<html><body><p>{text}</p></body></html>"
    p = page({**FIREHOSE, "body": html, "encoding": encoding})
    assert decode_html(p.body, p.header("content-type")) == html


def test_base64_bodies_by_mapping_and_their_encoding_as_the_charset() -> None:
    raw = "<p>café</p>".encode("cp1252")
    msg = {**FIREHOSE, "body": base64.b64encode(raw).decode(), "encoding": "cp1252"}
    p = page(msg, json_fields="body_b64=body")
    assert p.body == raw and p.header("content-type") == "text/html; charset=cp1252"
    assert decode_html(p.body, p.header("content-type")) == "<p>café</p>"


@pytest.mark.parametrize(("when", "expect"), [
    (1608672424, "2020-12-22T21:27:04Z"), (1608672424.5, "2020-12-22T21:27:04.500000Z"),
    (1608672424123, "2020-12-22T21:27:04.123000Z"), ("2020-12-22", "2020-12-22"),
])
def test_timestamps_as_strings_or_epoch_seconds_or_milliseconds(when: Any, expect: str) -> None:
    assert page({**FIREHOSE, "timestamp": when}).fetched_at == expect


@pytest.mark.parametrize(("change", "kind", "says"), [
    ({"body": None}, "no-body", "'body'"),
    ({"body": {"html": "x"}}, "bad-body", "'body'"),
    ({"body": 5}, "bad-body", "got 5"),
    ({"encoding": "klingon-8"}, "unknown-encoding", "klingon-8"),
    ({"encoding": 8}, "unknown-encoding", "charset name"),
    ({"response_headers": "Content-Type: text/html"}, "bad-headers", "'response_headers'"),
    ({"response_headers": {"X": [1]}}, "bad-headers", "'response_headers'"),
    ({"response_headers": [["X"]]}, "bad-headers", "'response_headers'"),
    ({"status_code": "OK"}, "bad-status", "'status_code'"),
    ({"status_code": 42}, "bad-status", "100-999"),
    ({"status_code": True}, "bad-status", "true"),
    ({"timestamp": True}, "bad-timestamp", "'timestamp'"),
    ({"timestamp": -5}, "bad-timestamp", "-5"),
    ({"timestamp": 1e300}, "bad-timestamp", "'timestamp'"),
    ({"response_url": None, "url": None}, "no-url", "response_url | url"),
    ({"response_url": "http://x/\ud800"}, "bad-url", "surrogate"),
])
def test_each_bad_firehose_field_is_a_reject_of_its_own_kind(
        change: dict[str, Any], kind: str, says: str) -> None:
    item = read({**FIREHOSE, **change})
    assert isinstance(item, Rejected), item
    assert item.kind == kind and says in item.message, item.message
    assert item.raw == json.dumps({**FIREHOSE, **change}).encode()  # the dead letter's bytes


@pytest.mark.parametrize(("value", "kind"), [
    (b"not json", "bad-json"), (b"[1, 2]", "bad-json"), (b'{"url": "u"', "bad-json"),
])
def test_what_is_not_a_json_object_is_bad_json(value: bytes, kind: str) -> None:
    item = read(value)
    assert isinstance(item, Rejected) and item.kind == kind
    assert item.url == "http://key.example/"  # the key names it when the value cannot


def test_a_mapping_reads_any_dialect_and_nested_fields() -> None:
    msg = {"link": "http://m.example/", "doc": {"html": "<p>x</p>", "code": "404"},
           "when": 1_600_000_000, "hdrs": [["Server", "nginx"]]}
    p = page(msg, "json", json_fields="url=link,html=doc.html,status=doc.code,"
                                      "fetched_at=when,headers=hdrs")
    assert (p.url, p.body, p.status, p.fetched_at) == (
        "http://m.example/", b"<p>x</p>", 404, "2020-09-13T12:26:40Z")
    assert p.header("server") == "nginx"
    # alternatives: the first present wins
    two = "url=canonical|link"
    assert page({**msg, "html": "y"}, "json", json_fields=two).url == "http://m.example/"
    assert page({**msg, "html": "y", "canonical": "http://c/"}, "json",
                json_fields=two).url == "http://c/"
    # a field left unmapped keeps the format's own name
    assert page({"link": "http://m/", "html": "z"}, "json", json_fields="url=link").body == b"z"


def test_the_plain_json_format_reads_as_before_with_or_without_carried_fields() -> None:
    value = json.dumps({"url": "http://j/", "html": "<p>j</p>", "status": 200,
                        "fetched_at": "2026-01-01T00:00:00Z", "crawlid": 7}).encode()
    plain = page_from_json(value, "t/0/5")
    carried = page(value, "json", carry_fields="crawlid,missing")
    assert carried.carried == (("crawlid", 7), ("missing", None))
    assert replace(carried, carried=(), position=None) == plain
    assert dialect_for(Settings()) is None  # no flag: the plain path, nothing added
    assert dialect_for(Settings(input_format="html")) is None


@pytest.mark.parametrize(("text", "says"), [
    ("url", "PAGE_FIELD=MESSAGE_FIELD"), ("uri=link", "not a page field"),
    ("url=a,url=b", "mapped twice"), ("url=", "not a field name"),
    ("html=a..b", "not a field name"), ("status=a|", "not a field name"),
])
def test_a_bad_mapping_is_a_clear_error_at_start(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Settings(json_fields=text)


def test_mappings_and_carried_names_as_parsed() -> None:
    assert json_field_map(" url = response_url|url , html=meta.body ") == {
        "url": (("response_url",), ("url",)), "html": (("meta", "body"),)}
    assert carry_names("crawlid, appid,meta.id") == ("crawlid", "appid", "meta.id")
    with pytest.raises(ConfigError, match="twice"):
        Settings(carry_fields="a,a")
    with pytest.raises(ConfigError, match="at most 32"):
        Settings(carry_fields=",".join(f"f{i}" for i in range(33)))
    with pytest.raises(ConfigError, match="not JSON"):
        Settings(input_format="html", json_fields="url=link")
    with pytest.raises(ConfigError, match="scrapy-cluster"):
        Settings(input_format="avro")


def test_carried_fields_as_they_are_null_when_missing_and_refused_when_huge() -> None:
    p = page({**FIREHOSE, "attrs": {"depth": 2}}, carry_fields="crawlid,appid,attrs,nope,"
                                                              "attrs.depth")
    assert p.carried == (("crawlid", "abc123"), ("appid", "testapp"), ("attrs", {"depth": 2}),
                         ("nope", None), ("attrs.depth", 2))
    ok = "x" * CARRY_MAX_CHARS
    assert page({**FIREHOSE, "crawlid": ok}, carry_fields="crawlid").carried[0][1] == ok
    big = read({**FIREHOSE, "crawlid": ok + "x"}, carry_fields="crawlid,appid")
    assert isinstance(big, Rejected) and big.kind == "carried-too-large"
    assert big.carried == (("crawlid", None), ("appid", "testapp"))  # the reject still joins
    nested = read({**FIREHOSE, "attrs": {"k": "v" * CARRY_MAX_CHARS}}, carry_fields="attrs")
    assert isinstance(nested, Rejected) and nested.kind == "carried-too-large"
    bad = read({**FIREHOSE, "body": 5}, carry_fields="crawlid")  # a reject carries them too
    assert isinstance(bad, Rejected) and bad.carried == (("crawlid", "abc123"),)


def test_the_html_format_carries_kafka_headers() -> None:
    dialect = dialect_for(Settings(input_format="html", carry_fields="crawlid,appid"))
    headers = [("CrawlId", b"c-9"), ("crawlid", b"second"), ("status", b"200")]
    p = page_from_message(b"<p>h</p>", b"http://h/", headers, "t/0/1", input_format="html",
                          max_bytes=100, dialect=dialect)
    assert isinstance(p, Page) and p.carried == (("crawlid", "c-9"), ("appid", None))
    too_big = [("crawlid", b"x" * (CARRY_MAX_CHARS + 1)), ("appid", b"a")]
    r = page_from_message(b"<p>h</p>", b"http://h/", too_big, "t/0/1", input_format="html",
                          max_bytes=100, dialect=dialect)
    assert isinstance(r, Rejected) and r.kind == "carried-too-large"
    assert r.carried == (("crawlid", None), ("appid", "a"))
    bad = page_from_message(b"<p>h</p>", b"http://h/", [("status", b"abc"), ("appid", b"a")],
                            "t/0/1", input_format="html", max_bytes=100, dialect=dialect)
    assert isinstance(bad, Rejected) and bad.kind == "bad-field"
    assert bad.carried == (("crawlid", None), ("appid", "a"))


def test_decisions_carry_the_fields_and_only_when_there_are_some() -> None:
    d = Decision("u", "keep", "unique", carried=(("crawlid", "c"), ("n", None)))
    assert d.to_dict()["carried"] == {"crawlid": "c", "n": None}
    assert json.loads(d.to_json())["carried"] == {"crawlid": "c", "n": None}
    assert "carried" not in Decision("u", "keep", "unique").to_dict()


def test_the_pipeline_hands_each_page_its_own_carried_fields() -> None:
    """Through check_batch: kept, dropped, rejected, and a record delivered again (its
    remembered decision, with the fields of the record it answers now)."""
    dedup = Deduplicator(Settings())
    html = b"<html><body><p>" + b" ".join(b"word%d" % i for i in range(300)) + b"</p></body>"
    first = Page("http://p/1", html, source="t/0/1", carried=(("crawlid", "a"),))
    copy = Page("http://p/2", html, source="t/0/2", carried=(("crawlid", "b"),))
    bad = Rejected("http://p/3", "bad-body", "no", "t/0/3", b"x", (("crawlid", "c"),))
    plain = Page("http://p/4", html + b"<p>more</p>", source="t/0/4")
    out = dedup.check_batch([first, copy, bad, plain])
    assert [(d.decision, d.carried) for d in out] == [
        ("keep", (("crawlid", "a"),)), ("drop", (("crawlid", "b"),)),
        ("reject", (("crawlid", "c"),)), (out[3].decision, ())]
    again = dedup.check_batch([Page("http://p/2", html, source="t/0/2",
                                    carried=(("crawlid", "b2"),))])
    assert again[0].decision == "drop" and again[0].carried == (("crawlid", "b2"),)
    assert dedup.reject(bad).carried == (("crawlid", "c"),)


def test_the_warc_format_carries_kafka_headers_and_skips_stay_skipped() -> None:
    from formatkit import warc_message

    from stream_dedup.models import Skipped

    dialect = dialect_for(Settings(input_format="warc", carry_fields="crawlid"))
    assert dialect is not None and not dialect.json
    html = Page("http://w.example/", b"<p>w</p>", (("Content-Type", "text/html"),),
                "2026-01-01T00:00:00Z", 200)
    _, value, _ = warc_message(html)
    p = page_from_message(value, None, [("crawlid", b"w-1")], "t/0/1", input_format="warc",
                          max_bytes=1 << 20, position=3, dialect=dialect)
    assert isinstance(p, Page) and (p.url, p.body, p.position) == (html.url, html.body, 3)
    assert p.carried == (("crawlid", "w-1"),)
    plain = page_from_message(value, None, [], "t/0/1", input_format="warc",
                              max_bytes=1 << 20, position=3)
    assert isinstance(plain, Page) and replace(p, carried=()) == plain
    request = value.replace(b"WARC-Type: response", b"WARC-Type: request")
    skipped = page_from_message(request, None, [("crawlid", b"w-1")], "t/0/2",
                                input_format="warc", max_bytes=1 << 20, dialect=dialect)
    assert isinstance(skipped, Skipped)
    bad = page_from_message(b"not a record", None, [("crawlid", b"w-1")], "t/0/3",
                            input_format="warc", max_bytes=1 << 20, dialect=dialect)
    assert isinstance(bad, Rejected) and bad.kind == "not-warc"
    assert bad.carried == (("crawlid", "w-1"),)
