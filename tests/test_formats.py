"""Each Kafka input format through `serve` on a real broker gives the decisions `replay`
gives the same pages: the corpus's real pages (../shared/corpora/warc) as json, html,
scrapy-cluster and mapped-JSON messages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from formatkit import (
    MAPPING,
    Message,
    firehose_message,
    html_message,
    json_message,
    mapped_message,
)
from opskit import wait_for
from test_corpus import CORPORA, WARCS
from test_service import (
    create_topics,
    decisions_of,
    kcat_consume,
    names,
    service,  # noqa: F401  (the fixture)
)

from stream_dedup import Settings
from stream_dedup.kafka.dialects import dialect_for
from stream_dedup.kafka.messages import page_from_message
from stream_dedup.models import Page
from stream_dedup.replay.run import replay
from stream_dedup.sinks.files import MemorySink
from stream_dedup.sources.files import iter_inputs

pytestmark = [
    pytest.mark.kafka, pytest.mark.slow, pytest.mark.corpus,
    pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is not here"),
]
MAX_BYTES = 400_000  # a page's message stays under the broker's 1 MB default


def _pages() -> list[Page]:
    """The corpus's HTML responses (not revisits, under MAX_BYTES) that every format can
    carry byte for byte: the firehose's decoded text, encoded again, gives back the bytes
    (all but 16 of the 1,046 pages do; those differ in bytes, not in text, so their
    exact-layer reasons could differ)."""
    archives = sorted(p for p in WARCS.rglob("*") if ".arc" in p.name or ".warc" in p.name)
    dialect = dialect_for(Settings(input_format="scrapy-cluster"))
    out = []
    for item in iter_inputs(archives):
        if not isinstance(item, Page) or item.revisit is not None or len(item.body) > MAX_BYTES:
            continue
        key, value, headers = firehose_message(item)
        again = page_from_message(value, key, headers, "", input_format="scrapy-cluster",
                                  max_bytes=1 << 24, dialect=dialect)
        if isinstance(again, Page) and again.body == item.body:
            out.append(item)
    return out


PAGES = _pages() if CORPORA.is_dir() else []


def _key(d: dict[str, Any]) -> tuple[Any, ...]:
    dup = d["duplicate_of"]
    return (d["url"], d["decision"], d["reason"], dup and dup["url"], d["shared_features"],
            d["resemblance"], d["verified"], d["previous"] and d["previous"]["url"])


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """`replay` of the pages as a JSONL file (the raw bytes, base64)."""
    path = tmp_path_factory.mktemp("formats") / "pages.jsonl"
    path.write_bytes(b"".join(json_message(p)[1] + b"\n" for p in PAGES))
    sink = MemorySink()
    replay([path], sink, Settings())
    return [d.to_dict() for d in sink.decisions]


def _produce(bootstrap: str, topic: str, messages: list[Message]) -> None:
    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=1 << 20,
                                    linger_ms=20)
        await producer.start()
        try:
            for key, value, headers in messages:
                await producer.send(topic, value, key=key, headers=headers)
            await producer.flush()
        finally:
            await producer.stop()
    asyncio.run(go())


def _crawlid(i: int) -> str:
    return f"crawl-{i % 7}-{i}"


FORMATS: dict[str, tuple[Callable[[Page, int], Message], list[str]]] = {
    "json": (lambda p, _: json_message(p), []),
    "html": (lambda p, _: html_message(p), ["--input-format", "html"]),
    "scrapy-cluster": (lambda p, i: firehose_message(p, _crawlid(i)),
                       ["--input-format", "scrapy-cluster", "--carry-fields",
                        "crawlid,appid,attrs"]),
    "json-fields": (lambda p, _: mapped_message(p),
                    ["--input-format", "json", "--json-fields", MAPPING]),
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_through_serve_decides_as_replay(
        kafka_bootstrap: str, service, replayed: list[dict[str, Any]],  # noqa: F811
        fmt: str) -> None:  # type: ignore[no-untyped-def]
    assert len(PAGES) > 800
    assert sum(d["decision"] == "drop" for d in replayed) >= 20  # a test that can fail
    b, t = kafka_bootstrap, names(f"fmt-{fmt}")
    create_topics(b, [t["input"]], partitions=1)
    build, flags = FORMATS[fmt]
    _produce(b, t["input"], [build(p, i) for i, p in enumerate(PAGES)])
    svc = service(t, *flags, "--batch-size", "100")
    wait_for("every page decided", lambda: len(kcat_consume(b, t["decisions"])) >= len(PAGES),
             timeout=300)
    assert svc.stop() == 0
    got = decisions_of(b, t["decisions"])
    assert [d["source"] for d in got] == [f"{t['input']}/0/{i}" for i in range(len(PAGES))]
    assert [_key(d) for d in got] == [_key(d) for d in replayed]
    if fmt == "scrapy-cluster":
        assert [d["carried"] for d in got] == [
            {"crawlid": _crawlid(i), "appid": "testapp", "attrs": None}
            for i in range(len(PAGES))]
    else:
        assert all("carried" not in d for d in got)
    assert kcat_consume(b, t["dead"]) == []
