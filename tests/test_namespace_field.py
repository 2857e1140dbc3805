"""A page's namespace from its own message (--namespace-field; sources/namespace_field.py):
read in every input format and in replay's JSONL files, a bad one a `bad-namespace` reject;
the decision naming its namespace (docs/decision.schema.json); the bounded namespace label
of the metrics. The last test runs `serve` on a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from opskit import samples, wait_for
from schemakit import decision_of, problems
from test_poison import kcat_raw
from test_service import (
    committed_and_end,
    create_topics,
    decisions_of,
    kcat_consume,
    names,
    service,  # noqa: F401  (the fixture)
)
from test_warc_kafka import raw_messages

from stream_dedup import Deduplicator, Settings
from stream_dedup.cli.sample import build
from stream_dedup.errors import ConfigError
from stream_dedup.kafka.dialects import dialect_for
from stream_dedup.kafka.messages import page_from_message
from stream_dedup.metrics import NAMESPACE_LABELS, Metrics
from stream_dedup.models import Decision, Page, Rejected
from stream_dedup.pipeline import memo as memo_module
from stream_dedup.pipeline.analysis import AnalysisPool, Analyzer
from stream_dedup.pipeline.deduplicator import StageTimes
from stream_dedup.replay import units
from stream_dedup.sources.files import iter_inputs
from stream_dedup.sources.jsonl import iter_jsonl_range
from stream_dedup.sources.stats import SourceStats

PAGES = [p for p in build(seed=44) if p.expected == ("keep", "unique")]
HTML = PAGES[0].html
# Values a message may give that name no namespace, each with what the error says
BAD_VALUES: list[tuple[Any, str]] = [
    (7, "must be a string"), (True, "must be a string"), (["c1"], "must be a string"),
    ({"id": "c1"}, "must be a string"), ("", "needs a name"), ("crawl 1", "is not a namespace"),
    ("_other", "is not a namespace"), ("x" * 129, "is not a namespace"),
    ("caf\u00e9", "is not a namespace"),
]


def read(obj: dict[str, Any], fmt: str = "json", headers: list[tuple[str, bytes]] | None = None,
         value: bytes | None = None, **flags: str) -> Page | Rejected:
    dialect = dialect_for(Settings(input_format=fmt, **flags))
    return page_from_message(json.dumps(obj).encode() if value is None else value,
                             b"http://key.example/", headers or [], "t/0/5",
                             input_format=fmt, max_bytes=1 << 20, position=9, dialect=dialect)


def firehose(**more: Any) -> dict[str, Any]:
    return {"url": "http://s.example/", "response_url": "http://s.example/final",
            "status_code": 200, "body": HTML, "encoding": "utf-8", "timestamp": "2026-01-01",
            "crawlid": "crawl-7", "appid": "app", **more}


# --- reading ------------------------------------------------------------------------------
def test_each_json_format_reads_the_namespace_from_its_field() -> None:
    plain = {"url": "http://j.example/", "html": HTML, "meta": {"crawl": "c-1"}, "ns": "c2"}
    assert read(plain, namespace_field="ns").namespace == "c2"
    assert read(plain, namespace_field="meta.crawl").namespace == "c-1"  # nested, as carried
    assert read(plain).namespace == ""  # no flag: the field is just a field
    mapped = {"link": "http://m.example/", "content": HTML, "crawlid": "m:1@x+y/z_2.3"}
    got = read(mapped, json_fields="url=link,html=content", namespace_field="crawlid")
    assert isinstance(got, Page) and (got.url, got.namespace) == ("http://m.example/",
                                                                  "m:1@x+y/z_2.3")
    sc = read(firehose(), "scrapy-cluster", namespace_field="crawlid", carry_fields="appid")
    assert isinstance(sc, Page) and sc.namespace == "crawl-7"
    assert (sc.url, sc.carried, sc.position) == ("http://s.example/final", (("appid", "app"),),
                                                9)
    assert read(firehose(), "scrapy-cluster", namespace_field="appid").namespace == "app"


def test_a_message_without_the_field_is_decided_in_the_process_namespace() -> None:
    for obj in ({"url": "http://j/", "html": HTML}, {"url": "http://j/", "html": HTML,
                                                     "ns": None}, {"url": "http://j/",
                                                                   "html": HTML, "ns": 5.5}):
        got = read(obj, namespace_field="ns.deeper")  # 5.5 holds no "deeper": absent
        assert isinstance(got, Page) and got.namespace == "", got
    assert read(firehose(crawlid=None), "scrapy-cluster",
                namespace_field="crawlid").namespace == ""


def test_html_and_warc_messages_name_it_in_a_kafka_header() -> None:
    from formatkit import warc_message

    html = read({}, "html", [("CrawlID", b"h-1"), ("crawlid", b"second"),
                             ("status", b"200")], HTML.encode(), namespace_field="crawlid")
    assert isinstance(html, Page) and (html.namespace, html.status) == ("h-1", 200)
    assert read({}, "html", [("status", b"200")], HTML.encode(),
                namespace_field="crawlid").namespace == ""
    assert read({}, "html", [("crawlid", None)], HTML.encode(),  # type: ignore[list-item]
                namespace_field="crawlid").namespace == ""  # a header without a value
    page = Page("http://w.example/", HTML.encode(), (("Content-Type", "text/html"),),
                "2026-01-01T00:00:00Z", 200)
    _, value, _ = warc_message(page)
    warc = read({}, "warc", [("crawlid", b"w-1")], value, namespace_field="crawlid",
                carry_fields="crawlid")
    assert isinstance(warc, Page) and (warc.url, warc.body) == (page.url, page.body)
    assert (warc.namespace, warc.carried, warc.position) == ("w-1", (("crawlid", "w-1"),), 9)
    assert read({}, "warc", [], value, namespace_field="crawlid").namespace == ""


@pytest.mark.parametrize(("value", "says"), BAD_VALUES, ids=lambda v: repr(v)[:20])
@pytest.mark.parametrize("fmt", ["json", "mapped", "scrapy-cluster"])
def test_a_json_message_naming_no_namespace_is_a_bad_namespace_reject(
        fmt: str, value: Any, says: str) -> None:
    flags = {"carry_fields": "appid", "namespace_field": "meta.crawl"}
    obj = {"url": "http://b.example/", "html": HTML, "appid": "app", "meta": {"crawl": value}}
    if fmt == "scrapy-cluster":
        obj = firehose(meta={"crawl": value})
    elif fmt == "mapped":
        flags["json_fields"] = "url=url,html=html"
    got = read(obj, "scrapy-cluster" if fmt == "scrapy-cluster" else "json", **flags)
    assert isinstance(got, Rejected), got
    assert got.kind == "bad-namespace" and "'meta.crawl'" in got.message and says in got.message
    assert got.raw == json.dumps(obj).encode()  # the dead letter gets the message as it came
    assert got.carried == (("appid", "app"),)  # and still joins to the crawler's records
    assert got.url in ("http://b.example/", "http://s.example/final")


@pytest.mark.parametrize(("raw", "says"), [
    (b"", "needs a name"), (b"\xffcrawl", "not UTF-8"), (b"a b", "is not a namespace"),
    (b"-lead", "is not a namespace")])
@pytest.mark.parametrize("fmt", ["html", "warc"])
def test_a_header_naming_no_namespace_is_a_bad_namespace_reject(
        fmt: str, raw: bytes, says: str) -> None:
    from formatkit import warc_message

    value = HTML.encode() if fmt == "html" else warc_message(Page("http://w/", b"<p>w</p>"))[1]
    got = read({}, fmt, [("appid", b"app"), ("crawlid", raw)], value,
               namespace_field="crawlid", carry_fields="appid")
    assert isinstance(got, Rejected), got
    assert (got.kind, got.raw, got.carried) == ("bad-namespace", value, (("appid", "app"),))
    assert "'crawlid'" in got.message and says in got.message


def test_the_field_must_be_a_field_name() -> None:
    with pytest.raises(ConfigError, match="namespace_field"):
        Settings(namespace_field="a..b")
    assert dialect_for(Settings(input_format="html")) is None  # no flag: nothing added
    assert dialect_for(Settings(namespace_field="crawlid")) is not None


# --- replay's JSONL files ------------------------------------------------------------------
def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows() -> list[dict[str, Any]]:
    """The same page in two namespaces, again in the first, without one, and a bad one."""
    return [{"url": "http://r/1", "html": HTML, "crawl": {"id": "c1"}},
            {"url": "http://r/2", "html": HTML, "crawl": {"id": "c2"}},
            {"url": "http://r/3", "html": HTML, "crawl": {"id": "c1"}},
            {"url": "http://r/4", "html": HTML},
            {"url": "http://r/5", "html": HTML, "crawl": {"id": 42}}]


def test_replay_readers_read_the_field_of_jsonl_lines(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "crawl.jsonl", _rows())
    stats = SourceStats()
    items = list(iter_inputs([path], stats, "crawl.id"))
    assert [getattr(i, "namespace", None) for i in items] == ["c1", "c2", "c1", "", None]
    bad = items[4]
    assert isinstance(bad, Rejected) and (bad.kind, bad.url, bad.source) == (
        "bad-namespace", "http://r/5", f"{path}#5")
    assert stats.rejected == {"bad-namespace": 1}
    assert [getattr(i, "namespace", None) for i in iter_inputs([path])] == ["", "", "", "", ""]
    ranged = list(iter_jsonl_range(path, 0, path.stat().st_size, 1, SourceStats(),
                                   name=str(path), namespace_field="crawl.id"))
    assert ranged == items


def test_a_worker_process_reading_a_unit_keeps_its_pages_namespaces(tmp_path: Path) -> None:
    """replay --workers: a JSONL unit read and packed in a worker comes back with each
    page's namespace, as read here."""
    path = _jsonl(tmp_path / "crawl.jsonl", _rows())
    settings = Settings(namespace_field="crawl.id")
    unit = next(u for u in units.plan_units([path], SourceStats(), unit_bytes=1 << 20)
                if isinstance(u, units.Unit))
    with AnalysisPool(settings, 2) as pool:
        assert pool.wait_ready(60)
        executor = pool.executor()
        assert executor is not None
        sent = units.unpack(executor.result(executor.submit(units.worker_read, unit)))
    here = units.read_unit(unit, Analyzer(settings), memo_module.Memo())
    for got in (sent, here):
        assert [i.namespace if isinstance(i, Page) else i.kind for i in got.items] == [
            "c1", "c2", "c1", "", "bad-namespace"]


def test_replay_decides_each_jsonl_page_in_its_namespace(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "crawl.jsonl", _rows())
    out, dead = tmp_path / "decisions.jsonl", tmp_path / "dead.jsonl"
    run = subprocess.run([sys.executable, "-m", "stream_dedup", "replay", str(path), "-o",
                          str(out), "--namespace-field", "crawl.id", "--namespace", "main",
                          "--dead-letter", str(dead)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    got = [decision_of(line) for line in out.read_text().splitlines()]
    assert [(d["url"], d["decision"], d["reason"], d.get("namespace")) for d in got] == [
        ("http://r/1", "keep", "unique", "c1"), ("http://r/2", "keep", "unique", "c2"),
        ("http://r/3", "drop", "exact", "c1"), ("http://r/4", "keep", "unique", "main"),
        ("http://r/5", "reject", "bad-namespace", "main")]
    assert "42" in got[4]["error"]
    assert "bad-namespace" in dead.read_text() and "http://r/5" in dead.read_text()


# --- decisions -----------------------------------------------------------------------------
def test_a_decision_names_its_namespace_unless_it_is_the_default() -> None:
    d = Decision("http://a/", "keep", "unique", page_id=3, cluster=3)
    assert "namespace" not in d.to_dict() and problems(d.to_dict()) == []
    named = d.in_namespace("crawl-1")
    assert named.to_dict()["namespace"] == "crawl-1" and problems(named.to_dict()) == []
    assert json.loads(named.to_json())["namespace"] == "crawl-1"
    assert named.in_namespace("crawl-1") is named and named.in_namespace("") == d
    for wrong in ("", "_other", "a b", "x" * 129):  # the schema refuses what is no name
        assert problems({**d.to_dict(), "namespace": wrong}), wrong


def test_the_pipeline_decides_and_labels_each_page_in_its_namespace() -> None:
    metrics = Metrics(process=False)
    dedup = Deduplicator(Settings(namespace="main"), observer=metrics)
    body = HTML.encode()
    items: list[Page | Rejected] = [
        Page("http://p/1", body, source="t/0/1", namespace="c1"),
        Page("http://p/2", body, source="t/0/2", namespace="c2"),  # not a copy: another crawl
        Page("http://p/3", body, source="t/0/3", namespace="c1"),
        Page("http://p/4", body, source="t/0/4"),  # the process's namespace
        Rejected("http://p/5", "bad-namespace", "no", "t/0/5", b"x")]
    out = dedup.check_batch(items)
    assert [(d.decision, d.reason, d.namespace) for d in out] == [
        ("keep", "unique", "c1"), ("keep", "unique", "c2"), ("drop", "exact", "c1"),
        ("keep", "unique", "main"), ("reject", "bad-namespace", "main")]
    assert out[2].duplicate_of is not None and out[2].duplicate_of.url == "http://p/1"
    again = dedup.check_batch([items[2]])[0]  # delivered again: the same decision
    assert again == out[2]
    assert dedup.reject(items[4]).namespace == "main"
    text = metrics.exposition()[0].decode()
    assert {k: v for k, v in samples(text, "stream_dedup_namespace_decisions_total").items()
            if v} == {'{decision="keep",namespace="c1"}': 1, '{decision="drop",namespace="c1"}': 1,
                      '{decision="keep",namespace="c2"}': 1,
                      '{decision="keep",namespace="main"}': 1,
                      '{decision="reject",namespace="main"}': 2}
    # the metrics without a namespace label are as they were
    assert samples(text, "stream_dedup_pages_total")['{decision="keep",reason="unique"}'] == 3


def test_the_namespace_label_names_at_most_the_first_n_namespaces() -> None:
    metrics = Metrics(process=False)
    names = [f"crawl-{i}" for i in range(NAMESPACE_LABELS + 5)]
    for name in [*names, *names[:2], "", ""]:
        metrics.page(Decision("http://a/", "keep", "unique", namespace=name), 10,
                     StageTimes())
    metrics.page(Decision("http://a/", "drop", "exact", namespace=names[-1]), 10,
                 StageTimes())
    got = samples(metrics.exposition()[0].decode(), "stream_dedup_namespace_decisions_total")
    named = {k for k in got if "crawl-" in k}
    assert named == {f'{{decision="keep",namespace="crawl-{i}"}}'
                     for i in range(NAMESPACE_LABELS)}
    assert got['{decision="keep",namespace="crawl-0"}'] == 2  # seen again: still its own
    assert got['{decision="keep",namespace="_other"}'] == 5  # the 51st and later
    assert got['{decision="drop",namespace="_other"}'] == 1
    assert got['{decision="keep",namespace="_default"}'] == 2
    assert len(got) == NAMESPACE_LABELS + 3
    text = metrics.exposition()[0].decode()
    assert f"the first {NAMESPACE_LABELS} namespaces" in text and "_other" in text  # HELP


# --- serve, on a real broker -----------------------------------------------------------------
@pytest.mark.kafka
@pytest.mark.slow
def test_serve_decides_html_messages_in_their_header_s_namespace(
        kafka_bootstrap: str, service) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    b, t = kafka_bootstrap, names("ns")
    create_topics(b, [t["input"]], partitions=1)
    body = HTML.encode()
    sent = [(b"https://n.example/1", (b"crawlid=c1",)), (b"https://n.example/2", (b"crawlid=c2",)),
            (b"https://n.example/3", (b"crawlid=c1",)), (b"https://n.example/4", ()),
            (b"https://n.example/5", (b"crawlid=",)),  # each poison kind in a header
            (b"https://n.example/6", (b"crawlid=\xff\xfe",)),
            (b"https://n.example/7", (b"crawlid=_other",)),
            (b"https://n.example/8", (b"crawlid=c2",))]
    for key, headers in sent:
        kcat_raw(b, t["input"], body, key, headers)
    svc = service(t, "--input-format", "html", "--namespace-field", "crawlid",
                  "--batch-size", "3")
    wait_for("every record decided",
             lambda: len(kcat_consume(b, t["decisions"])) >= len(sent), timeout=120)
    assert svc.proc.poll() is None, svc.text()[-3000:]
    assert svc.stop() == 0
    got = decisions_of(b, t["decisions"])
    assert [(d["decision"], d["reason"], d.get("namespace")) for d in got] == [
        ("keep", "unique", "c1"), ("keep", "unique", "c2"), ("drop", "exact", "c1"),
        ("keep", "unique", None), ("reject", "bad-namespace", None),
        ("reject", "bad-namespace", None), ("reject", "bad-namespace", None),
        ("drop", "exact", "c2")]
    assert got[7]["duplicate_of"]["url"] == "https://n.example/2"
    dead = raw_messages(b, t["dead"])  # (a header value not UTF-8: kcat's JSON cannot)
    assert [h["stream-dedup-error"] for _, h in dead] == [b"bad-namespace"] * 3
    assert [h["crawlid"] for _, h in dead] == [b"", b"\xff\xfe", b"_other"]  # as they came
    assert all(value == body for value, _ in dead)
    assert b"not UTF-8" in dead[1][1]["stream-dedup-message"]
    assert [h["stream-dedup-source"] for _, h in dead] == [
        f"{t['input']}/0/{i}".encode() for i in (4, 5, 6)]
    assert committed_and_end(b, t["input"], t["group"]) == (len(sent), len(sent))
