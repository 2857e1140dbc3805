"""The index's lifecycle end to end, as an operator drives it: one crawl replayed into
namespace `a`, then `b`, of one index (Redis, LSM, memory); `index forget` of its host in `a`;
the crawl decided again. The crawl: the IETF HTTP drafts' revisions (near-duplicates of each
other) on one host, with exact copies under a second path."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from indexkit import flush_redis
from opskit import free_port, wait_for
from test_corpus import CORPORA, HTTPBIS, httpbis_in_revision_order
from test_service import service  # noqa: F401  (the fixture)
from warcgen import Resp, write_warc

from stream_dedup import Settings
from stream_dedup.index import MemoryIndex
from stream_dedup.index.namespaces import selector
from stream_dedup.pipeline.deduplicator import Deduplicator
from stream_dedup.replay.run import replay
from stream_dedup.sinks.files import MemorySink

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


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_namespace_read_drops_against_a_reference_without_writing_to_it(
        crawl: Path, backend: str, request: pytest.FixtureRequest) -> None:
    settings = Settings()
    if backend == "redis":
        url = request.getfixturevalue("redis_url")
        flush_redis(url)
        settings = Settings(index="redis", redis_url=url)
    reference = Deduplicator(settings.replace(namespace="ref"))
    index = reference.index
    try:
        replay([crawl], MemorySink(), dedup=reference)
        held = index.namespaces()["ref"]["pages"]
        sink = MemorySink()
        replay([crawl], sink, dedup=Deduplicator(
            settings.replace(namespace="new", namespace_read="ref"), index))
        # every page is in the reference: none kept, none a version of a reference URL
        assert {(d.decision, d.reason) for d in sink.decisions} <= {
            ("drop", "exact"), ("drop", "canonical"), ("drop", "near"),
            ("drop", "near-verified"), ("drop", "contained")}
        assert index.namespaces()["ref"]["pages"] == held
        assert "new" not in index.namespaces()  # nothing was kept into "new" either
    finally:
        index.close()


@pytest.mark.parametrize("backend", ["memory", "lsm"])
def test_a_forget_over_http_survives_a_kill_and_a_changelog_restore(
        kafka_bootstrap: str, service, tmp_path: Path, backend: str) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """Under --exactly-once, /v1/forget writes its tombstones to the changelog before it
    answers: killed right after (no batch followed to carry them), the service restores an
    index that holds none of the pages forgotten (the memory index restores all of it from
    the changelog; the LSM index had forgotten them on disk already)."""
    from test_exactly_once import _all_decided, _fill
    from test_exactly_once import crawl as eo_crawl

    pages = eo_crawl()
    t = _fill(kafka_bootstrap, pages)
    token = {"STREAM_DEDUP_HTTP_TOKEN": "s3cret"}
    args = ["--exactly-once", "--batch-size", "40"]
    if backend == "lsm":
        args += ["--index", "lsm", "--index-path", str(tmp_path / "index")]

    def start(log: str) -> tuple[Any, str]:
        port = free_port()
        svc = service(t, *args, "--http-port", str(port), log=log, env=token)
        base = f"http://127.0.0.1:{port}"
        wait_for("the HTTP API", lambda: _call(base, "/healthz", None)[0] == 200, 60)
        return svc, base

    first, base = start("first.log")
    decided = _all_decided(kafka_bootstrap, t, len(pages))
    kept = [d for d in decided if d["decision"] == "keep"]
    once = [p for p in pages if sum(u == p[0] for u, _ in pages) == 1]
    url, html = next(p for p in once if p[0] in {d["url"] for d in kept})
    assert _call(base, "/v1/check", {"url": url, "html": html})[1]["decision"]["decision"] \
        == "drop"
    status, body = _call(base, "/v1/forget", {"all": True})
    assert status == 200 and body["forgotten"] == len({d["url"] for d in kept})
    first.stop(signal.SIGKILL)

    final, base = start("final.log")
    wait_for("restored", lambda: "restored" in final.text() or "partitions assigned"
             in final.text(), 90)
    status, body = _call(base, "/v1/check", {"url": url, "html": html})
    assert status == 200 and body["decision"]["decision"] == "keep", body
    assert final.stop() == 0


def _call(base: str, path: str, body: dict | None) -> tuple[int, Any]:
    request = urllib.request.Request(
        base + path, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer s3cret", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def test_an_exactly_once_lsm_index_is_not_forgotten_behind_its_changelog(
        tmp_path: Path) -> None:
    """Forgotten offline, an index a changelog restores would get the pages back at the
    next restore: the command refuses and sends the operator to the service's door."""
    from stream_dedup.index.lsm import LsmIndex

    index = LsmIndex(tmp_path / "index", Settings().params.stamp)
    index.commit({"pages/0": 10, "dedup-index-changelog/0": 7})
    index.close()
    done = subprocess.run([sys.executable, "-m", "stream_dedup", "index", "forget", "--all",
                           "--index-path", str(tmp_path / "index")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "dedup-index-changelog" in done.stderr and "POST /v1/forget" in done.stderr


@pytest.mark.parametrize("words", [
    {}, {"host": "a.example", "all": True}, {"host": "a b"}, {"host": "http://a.example/p"},
    {"host": ""}, {"url": " "}, {"before": "yesterday"}, {"before": "2026-13-01"},
    {"all": True, "namespace": "bad name"}, {"all": True, "namespace": "-x"}])
def test_a_selector_refuses_bad_words(words: dict) -> None:
    from stream_dedup.index.namespaces import NamespaceError

    with pytest.raises(NamespaceError):
        selector(**words)


def test_a_selector_normalizes_a_host_and_a_date() -> None:
    assert selector(host=" EXAMPLE.com:8080 ").host == "example.com"
    assert selector(before="2026-01-01").before == selector(before="2026-01-01T00:00Z").before
