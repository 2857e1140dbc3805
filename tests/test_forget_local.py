"""Namespaces and forgetting on the in-process backends (memory, LSM), through the
Deduplicator as the service and replay drive it: isolation, URL versions a namespace,
forgetting by URL, host, time and all (and only in the namespace named), a forgotten page
decided as never seen, the LSM's forgetting durable, the memory index's retention, and a
forget carried by the changelog to a restored index."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from stream_dedup import Page, Settings
from stream_dedup.index import MemoryIndex
from stream_dedup.index.lsm import LsmIndex
from stream_dedup.index.namespaces import Forget, selector
from stream_dedup.kafka import changelog as cl
from stream_dedup.pipeline.deduplicator import Deduplicator

OLD, NEW = "2020-03-01T00:00:00Z", "2026-11-20T00:00:00Z"
_WORDS = [f"w{i}" for i in range(5000)]


def _html(seed: int) -> bytes:
    rng = random.Random(seed)
    return ("<html><body><p>" + " ".join(rng.choice(_WORDS) for _ in range(400))
            + "</p></body></html>").encode()


class Crawl:
    """A Deduplicator over one index, pages numbered as they come."""

    def __init__(self, backend: str, tmp_path: Path, name: str = "i") -> None:
        self.backend, self.path = backend, tmp_path / name
        self.dd = self._open()
        self.n = 0

    def _open(self) -> Deduplicator:
        if self.backend == "lsm":
            return Deduplicator(Settings(index="lsm", index_path=str(self.path)))
        return Deduplicator(Settings())

    def reopen(self) -> None:
        self.dd.close()
        self.dd = self._open()

    def page(self, url: str, seed: int, ns: str = "", fetched_at: str | None = None) -> Page:
        self.n += 1
        return Page(url=url, body=_html(seed), headers=(("Content-Type", "text/html"),),
                    position=self.n, namespace=ns, fetched_at=fetched_at)

    def decide(self, *pages: Page, commit: bool = True) -> list[tuple[str, str]]:
        got = self.dd.check_batch(list(pages), redeliveries=False)
        if commit:
            self.dd.commit()
        return [(d.decision, d.reason) for d in got]

    def one(self, url: str, seed: int, ns: str = "", fetched_at: str | None = None
            ) -> tuple[str, str]:
        return self.decide(self.page(url, seed, ns, fetched_at))[0]

    def pages(self) -> dict[str, int]:
        return {name: v["pages"] for name, v in self.dd.index.namespaces().items()}


BACKENDS = ["memory", "lsm"]
KEEP, EXACT, UNCHANGED = ("keep", "unique"), ("drop", "exact"), ("drop", "unchanged")


@pytest.fixture(params=BACKENDS)
def crawl(request: pytest.FixtureRequest, tmp_path: Path) -> Crawl:
    c = Crawl(request.param, tmp_path)
    yield c
    c.dd.close()


def test_namespaces_isolate_their_pages(crawl: Crawl) -> None:
    assert crawl.one("http://h/1", 1, "a") == KEEP
    assert crawl.one("http://h/1-copy", 1, "b") == KEEP  # the same page, another namespace
    assert crawl.one("http://h/1-copy", 1, "a") == EXACT
    assert crawl.one("http://h/1-again", 1, "b") == EXACT
    assert crawl.pages() == {"a": 1, "b": 1}
    assert crawl.dd.index.stats()["namespaces"] == crawl.dd.index.namespaces()
    assert crawl.dd.index.stats()["pages"] == 2


def test_a_url_has_a_version_in_each_namespace(crawl: Crawl) -> None:
    assert crawl.one("http://h/u", 1, "a") == KEEP
    assert crawl.one("http://h/u", 1, "b") == KEEP
    assert crawl.one("http://h/u", 1, "a") == UNCHANGED
    assert crawl.one("http://h/u", 1, "b") == UNCHANGED
    assert crawl.one("http://h/u", 2, "a")[0] == "keep"  # a new version replaces a's only
    assert crawl.pages() == {"a": 1, "b": 1}
    assert crawl.one("http://h/u", 1, "b") == UNCHANGED
    assert crawl.one("http://h/u", 2, "a") == UNCHANGED


def test_a_process_namespace_sees_its_url_versions(tmp_path: Path) -> None:
    """The namespace set for the process (--namespace), not the page's own."""
    dd = Deduplicator(Settings(namespace="a"))
    page = Page(url="http://h/u", body=_html(1), headers=(("Content-Type", "text/html"),))
    assert [(d.decision, d.reason) for d in dd.check_batch([page, page],
                                                          redeliveries=False)][1] == UNCHANGED
    assert (dd.check(page).decision, dd.check(page).reason) == UNCHANGED
    dd.close()


def _fill(crawl: Crawl) -> dict[str, list[int]]:
    """Pages of hosts x (2, one crawled long ago) and y (1) in namespaces a and b."""
    for ns in ("a", "b"):
        got = crawl.decide(crawl.page("http://x.example/1", 10, ns, OLD),
                           crawl.page("http://x.example/2", 11, ns, NEW),
                           crawl.page("http://y.example/1", 12, ns, NEW))
        assert got == [KEEP] * 3
    return {"a": [1, 2, 3], "b": [4, 5, 6]}


# the selector, the page ids (1-3: a's pages, seeds 10-12) it forgets
CASES = {
    "url": (dict(url="http://x.example/2"), [2]),
    "host": (dict(host="X.example"), [1, 2]),
    "before": (dict(before="2025-01-01"), [1]),
    "all": (dict(all=True), [1, 2, 3]),
}


@pytest.mark.parametrize("case", CASES)
def test_forget_in_a_namespace(crawl: Crawl, case: str) -> None:
    _fill(crawl)
    words, ids = CASES[case]
    gone = crawl.dd.forget(selector(namespace="a", **words))  # type: ignore[arg-type]
    assert sorted(gone) == ids
    assert crawl.pages() == {"a": 3 - len(ids), "b": 3} if len(ids) < 3 else {"b": 3}
    assert len(crawl.dd.index) == 6 - len(ids)
    # b is untouched: every page of it is still held
    for url, seed in (("http://x.example/1", 10), ("http://x.example/2", 11),
                      ("http://y.example/1", 12)):
        assert crawl.one(url, seed, "b") == UNCHANGED
    # a's forgotten pages come back as never seen; the others are still held
    for pid, url, seed in ((1, "http://x.example/1", 10), (2, "http://x.example/2", 11),
                           (3, "http://y.example/1", 12)):
        assert crawl.one(url, seed, "a") == (KEEP if pid in ids else UNCHANGED), url
        assert crawl.one(url + "?copy", seed, "a") == EXACT


def test_forget_every_namespace(crawl: Crawl) -> None:
    _fill(crawl)
    assert sorted(crawl.dd.forget(Forget(None, host="x.example"))) == [1, 2, 4, 5]
    assert crawl.pages() == {"a": 1, "b": 1}
    assert sorted(crawl.dd.forget(Forget(None, all=True))) == [3, 6]
    assert crawl.pages() == {} and len(crawl.dd.index) == 0
    assert crawl.dd.index.stats()["pages"] == 0
    assert crawl.one("http://y.example/1", 12, "b") == KEEP


def test_retention_forgets_the_pages_crawled_before_it(crawl: Crawl) -> None:
    _fill(crawl)
    oldest = crawl.dd.index.namespaces()["a"]["oldest"]
    assert oldest.startswith("2020-03-01")
    assert crawl.dd.expire(datetime(2025, 1, 1, tzinfo=UTC)) == 2  # x/1 of a and of b
    spaces = crawl.dd.index.namespaces()
    assert {name: v["pages"] for name, v in spaces.items()} == {"a": 2, "b": 2}
    assert spaces["a"]["oldest"] >= "2025-01-01"
    assert crawl.one("http://x.example/1", 10, "a") == KEEP


def test_a_forget_of_pages_not_committed_yet(crawl: Crawl) -> None:
    """Between two batches whose pages were not committed: the overlay's pages go too."""
    assert crawl.decide(crawl.page("http://x.example/1", 10, "a"),
                        crawl.page("http://x.example/2", 11, "a"), commit=False) == [KEEP] * 2
    assert crawl.dd.forget(selector(namespace="a", url="http://x.example/1")) == [1]
    assert crawl.dd.forget(selector(namespace="a", host="x.example")) == [2]
    crawl.dd.commit()
    assert len(crawl.dd.index) == 0 and crawl.pages() == {}
    assert crawl.one("http://x.example/2", 11, "a") == KEEP


def test_lsm_forgetting_is_durable(tmp_path: Path) -> None:
    crawl = Crawl("lsm", tmp_path)
    _fill(crawl)
    assert sorted(crawl.dd.forget(selector(namespace="a", host="x.example"))) == [1, 2]
    crawl.reopen()
    assert crawl.pages() == {"a": 1, "b": 3}
    assert crawl.dd.index.stats()["pages"] == 4
    assert crawl.one("http://x.example/1", 10, "a") == KEEP
    assert crawl.one("http://x.example/3", 11, "a") == KEEP  # x/2's body: not held in a
    assert crawl.dd.forget(selector(namespace="b", all=True)) == [4, 5, 6]
    assert sorted(crawl.dd.forget(Forget(None, all=True))) == [3, 7, 8]
    crawl.reopen()
    index = crawl.dd.index
    assert isinstance(index, LsmIndex)
    assert index.stats()["pages"] == 0 and len(index) == 0 and index.namespaces() == {}
    index.compact()
    assert [k for k in index._docs.keys()] == [] and [k for k in index._urls.keys()] == []
    crawl.dd.close()


def test_an_lsm_index_written_before_namespaces_forgets_too(tmp_path: Path) -> None:
    """Its pages get their ids and times once, when it is opened: a forget by page id (a
    restore) and by time find them."""
    crawl = Crawl("lsm", tmp_path)
    crawl.decide(crawl.page("http://x.example/1", 10, "", OLD),
                 crawl.page("http://x.example/2", 11, "", NEW))
    index = crawl.dd.index
    assert isinstance(index, LsmIndex)
    for cf in (index._ids, index._times):  # as an index written before them
        for key in list(cf.keys()):
            del cf[key]
    for key in (b"lifecycle", b"ns:"):
        index._meta.delete(key)
    del index, cf  # RocksDB's lock goes with the last handle
    crawl.reopen()
    assert crawl.pages() == {"": 2}
    assert crawl.dd.forget(Forget(page_ids=frozenset({2, 99}))) == [2]
    assert crawl.dd.expire(datetime(2025, 1, 1, tzinfo=UTC)) == 1
    assert crawl.pages() == {} and crawl.dd.index.stats()["pages"] == 0
    crawl.dd.close()


def test_a_memory_index_warmed_from_lsm_keeps_namespaces(tmp_path: Path) -> None:
    crawl = Crawl("lsm", tmp_path)
    _fill(crawl)
    crawl.dd.close()
    snapshot = LsmIndex(tmp_path / "i", stamp=None)
    warm = MemoryIndex.warm_from(snapshot)
    snapshot.close()
    dd = Deduplicator(Settings(), index=warm)
    assert {n: v["pages"] for n, v in warm.namespaces().items()} == {"a": 3, "b": 3}
    page = Page("http://x.example/2", _html(11), (("Content-Type", "text/html"),),
                namespace="a", position=100)
    assert (dd.check(page).decision, dd.check(page).reason) == UNCHANGED
    assert sorted(dd.forget(selector(namespace="b", host="x.example"))) == [4, 5]
    dd.close()


# --- the changelog ------------------------------------------------------------------------

def _consumed(records: list[cl.Record], first: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(offset=first + i, key=k, value=v, headers=list(h))
            for i, (k, v, h) in enumerate(records)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forget_journaled_is_forgotten_by_a_restore(backend: str, tmp_path: Path) -> None:
    live = Crawl(backend, tmp_path, "live")
    live.dd.journal = []
    log: list[SimpleNamespace] = []

    def journal(batch: str) -> None:
        log.extend(_consumed(cl.records(live.dd.take_journal(), batch), len(log)))

    _fill(live)
    journal("p/0/0")
    assert sorted(live.dd.forget(selector(namespace="a", host="x.example"))) == [1, 2]
    live.decide(live.page("http://z.example/1", 20, "a"))
    journal("p/0/1")
    tombstones = [r for r in log if r.value is None]
    assert [int.from_bytes(r.key, "big") for r in tombstones] == [1, 2]
    assert all(dict(r.headers)[cl.FORGET_HEADER] == b"1" for r in tombstones)
    assert [forgotten for _, forgotten, _ in cl.changes(log)] == [[], [1, 2]]

    restored = Crawl(backend, tmp_path, "restored")
    for docs, forgotten, _ in cl.changes(log):
        cl.restore_batch(restored.dd.index, docs, forgotten)  # type: ignore[arg-type]
    restored.dd.commit()
    assert restored.pages() == live.pages() == {"a": 2, "b": 3}
    assert restored.one("http://x.example/1", 10, "a") == KEEP
    assert restored.one("http://y.example/1", 12, "a") == UNCHANGED
    assert restored.one("http://x.example/1", 10, "b") == UNCHANGED
    live.dd.close()
    restored.dd.close()


def test_a_replaced_version_tombstone_forgets_nothing(tmp_path: Path) -> None:
    """A new version's tombstone of the old one is no forget: a restore from a position
    after the new version leaves what it holds alone."""
    live = Crawl("memory", tmp_path)
    live.dd.journal = []
    live.one("http://h/u", 1, "a")
    live.one("http://h/u", 2, "a")
    log = _consumed(cl.records(live.dd.take_journal(), "p/0/0"), 0)
    assert [r.value is None for r in log] == [False, False, True]
    assert [forgotten for _, forgotten, _ in cl.changes(log)] == [[]]
    live.dd.close()
