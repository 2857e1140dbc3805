"""The index's lifecycle end to end, as an operator drives it: one crawl replayed into
namespace `a`, then `b`, of one index (Redis, LSM, memory); `index forget` of its host in `a`;
the crawl decided again. The crawl: the IETF HTTP drafts' revisions (near-duplicates of each
other) on one host, with exact copies under a second path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stream_dedup import Settings
from stream_dedup.index import MemoryIndex
from stream_dedup.namespaces import selector
from stream_dedup.pipeline import Deduplicator
from stream_dedup.replay import replay
from stream_dedup.sinks import MemorySink
from tests.indexkit import flush_redis
from tests.test_corpus import CORPORA, HTTPBIS, httpbis_in_revision_order
from tests.warcgen import Resp, write_warc

pytestmark = pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is not here")
HOST = "drafts.example"


@pytest.fixture(scope="module")
def crawl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    records = []
    for i, rel in enumerate(httpbis_in_revision_order()[:120]):
        body = (HTTPBIS / rel).read_bytes()
        records.append(Resp(f"http://{HOST}/{rel}", body))
        if i % 4 == 0:
            records.append(Resp(f"http://{HOST}/copy/{rel}", body))
    return write_warc(tmp_path_factory.mktemp("crawl") / "drafts.warc.gz", records)


def _cli(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "stream_dedup", *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _replay(crawl: Path, index: list[str], namespace: str, out: Path) -> list[dict]:
    _cli("replay", str(crawl), *index, "--namespace", namespace, "-o", str(out), "-q")
    return [json.loads(line) for line in out.read_text().splitlines()]


def _outcome(decisions: list[dict]) -> list[tuple]:
    """What must be the same in two namespaces: each page's decision, reason and the URL of
    the page it was dropped against (page ids are the index's own)."""
    return [(d["url"], d["decision"], d["reason"], (d.get("duplicate_of") or {}).get("url"))
            for d in decisions]


def _kept(decisions: list[dict]) -> int:
    return sum(d["decision"] == "keep" for d in decisions)


def _forget(index: list[str], namespace: str) -> int:
    got = json.loads(_cli("index", "forget", "--host", HOST, "--namespace", namespace, *index))
    return int(got["forgotten"])


@pytest.mark.parametrize("backend", ["redis", "lsm"])
def test_a_crawl_in_two_namespaces_forgotten_by_host_and_decided_again(
        backend: str, crawl: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
        flush_redis(url)
        index = ["--index", "redis", "--redis-url", url]
    else:
        index = ["--index", "lsm", "--index-path", str(tmp_path / "index")]
    first = _replay(crawl, index, "a", tmp_path / "a1.jsonl")
    kept = _kept(first)
    assert kept and kept < len(first)  # the crawl has duplicates, and pages to keep
    assert _outcome(_replay(crawl, index, "b", tmp_path / "b1.jsonl")) == _outcome(first)
    assert _kept(_replay(crawl, index, "a", tmp_path / "a2.jsonl")) == 0

    assert _forget(index, "a") == kept
    if backend == "lsm":
        stats = json.loads(_cli("index", "stats", "--index-path", str(tmp_path / "index")))
        assert stats["namespaces"].get("a", {}).get("pages", 0) == 0
        assert stats["namespaces"]["b"]["pages"] == kept
    assert _outcome(_replay(crawl, index, "a", tmp_path / "a3.jsonl")) == _outcome(first)
    assert _kept(_replay(crawl, index, "b", tmp_path / "b2.jsonl")) == 0  # b untouched


def test_an_lsm_index_forgotten_by_host_holds_nothing(crawl: Path, tmp_path: Path) -> None:
    index = ["--index", "lsm", "--index-path", str(tmp_path / "index")]
    first = _replay(crawl, index, "a", tmp_path / "a1.jsonl")
    assert _forget(index, "a") == _kept(first)
    stats = json.loads(_cli("index", "stats", "--index-path", str(tmp_path / "index")))
    assert stats["pages"] == 0
    assert _outcome(_replay(crawl, index, "a", tmp_path / "a2.jsonl")) == _outcome(first)


def test_the_memory_index_in_two_namespaces_and_forgotten(crawl: Path) -> None:
    index = MemoryIndex(Settings().params.stamp)

    def run(namespace: str) -> list[dict]:
        sink = MemorySink()
        replay([crawl], sink, dedup=Deduplicator(Settings(namespace=namespace), index))
        return [d.to_dict() for d in sink.decisions]

    first = run("a")
    assert _outcome(run("b")) == _outcome(first)
    assert _kept(run("a")) == 0
    gone = Deduplicator(Settings(namespace="a"), index=index).forget(
        selector(namespace="a", host=HOST))
    assert len(gone) == _kept(first)
    assert _outcome(run("a")) == _outcome(first)
    assert index.namespaces()["b"]["pages"] == _kept(first)


def test_a_namespace_read_drops_against_a_reference_without_writing_to_it(
        crawl: Path) -> None:
    index = MemoryIndex(Settings().params.stamp)
    reference = MemorySink()
    replay([crawl], reference, dedup=Deduplicator(Settings(namespace="ref"), index))
    held = index.namespaces()["ref"]["pages"]
    sink = MemorySink()
    replay([crawl], sink, dedup=Deduplicator(Settings(namespace="new", namespace_read="ref"),
                                             index))
    assert all(d.decision == "drop" for d in sink.decisions)
    assert index.namespaces()["ref"]["pages"] == held
    assert "new" not in index.namespaces()  # nothing kept: all were in the reference
