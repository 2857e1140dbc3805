"""Namespaces and forgetting on the Redis index (index/redis/forget.py), against a real Redis
Cluster: namespaces kept apart, forgetting by URL, host, time and all within a namespace
(or every one), a page forgotten decided again as new, the counts an operator reads, a
forget under other sketch parameters refused, and a forget while two instances decide.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from indexkit import flush_redis

from stream_dedup import Settings
from stream_dedup.errors import IndexMismatchError
from stream_dedup.index.base import StoredDoc
from stream_dedup.index.namespaces import Forget, host_of, selector
from stream_dedup.index.redis.backend import RedisIndex, connect
from stream_dedup.index.redis.layout import (
    BUCKET_ENDS,
    PAGES,
    SHARDS,
    decode_doc,
    doc_probe,
    encode_doc,
    set_members,
)
from stream_dedup.models import Decision, Page
from stream_dedup.pipeline.deduplicator import Deduplicator

HTML = (("Content-Type", "text/html"),)


def page(url: str, n: int, fetched_at: str | None = "2026-01-02T00:00:00Z") -> Page:
    """A page whose text is the n-th of a family of unrelated texts."""
    text = " ".join(f"w{n}x{j}" for j in range(300))
    return Page(url, f"<p>{text}</p>".encode(), HTML, source=url, fetched_at=fetched_at)


@pytest.fixture
def url(redis_url: str) -> str:
    flush_redis(redis_url)
    return redis_url


@pytest.fixture
def make(url: str) -> Iterator[Any]:
    made: list[Deduplicator] = []

    def open_one(**settings: Any) -> Deduplicator:
        made.append(Deduplicator(Settings(index="redis", redis_url=url, **settings)))
        return made[-1]

    yield open_one
    for dd in made:
        dd.close()


PAGES_OF = [("http://a.example/1", 1), ("http://a.example/2", 2), ("http://b.example/3", 3),
            ("http://b.example/4", 4)]


def fill(dd: Deduplicator) -> dict[str, int]:
    """The four pages kept in dd's namespace: url -> page id."""
    decisions = dd.check_batch([page(u, n) for u, n in PAGES_OF])
    assert [d.decision for d in decisions] == ["keep"] * 4
    return {d.url: d.page_id for d in decisions if d.url is not None}


def again(dd: Deduplicator, u: str, n: int) -> Decision:
    """A new fetch of page n at URL u (a new page id)."""
    return dd.check_batch([page(u + "?again", n)])[0]


def test_records_name_their_namespace_and_old_ones_read_as_the_default() -> None:
    doc = StoredDoc("http://x/é", np.arange(6, dtype=np.uint64), np.arange(84, dtype=np.uint32),
                    b"sig", 10, 1, 2, "2026-01-02T00:00:00Z", 7, b"tops", 3, "crawl-7")
    back = decode_doc(encode_doc(doc), 7)
    assert (back.namespace, back.url, back.fetched_at) == ("crawl-7", "http://x/é",
                                                          "2026-01-02T00:00:00Z")
    old = encode_doc(StoredDoc(**{**_fields(doc), "namespace": ""}))
    assert not old.endswith(b"\0http://x/\xc3\xa9") and old.endswith("http://x/é".encode())
    assert decode_doc(old, 7).namespace == ""


def _fields(doc: StoredDoc) -> dict[str, Any]:
    return {name: getattr(doc, name) for name in StoredDoc.__slots__}  # type: ignore[attr-defined]


def test_namespaces_keep_their_pages_apart_on_redis(make: Any) -> None:
    a, b = make(namespace="a"), make(namespace="b")
    fill(a)
    fill(b)  # the same pages in another namespace: new there
    assert again(a, "http://a.example/1", 1).decision == "drop"
    assert again(b, "http://a.example/1", 1).decision == "drop"
    held = a.index.namespaces()
    assert {ns: v["pages"] for ns, v in held.items()} == {"a": 4, "b": 4}
    assert held["a"]["oldest"] == "2026-01-02T00:00:00+00:00"


@pytest.mark.parametrize("scope", ["a", None])
@pytest.mark.parametrize("how", ["url", "host", "before", "all"])
def test_forget_selects_pages_within_a_namespace(make: Any, how: str, scope: str | None
                                                 ) -> None:
    a, b, other = make(namespace="a"), make(namespace="b"), make()
    ids_a, ids_b = fill(a), fill(b)
    late = a.check_batch([page("http://b.example/5", 5, "2026-03-01T00:00:00Z")])[0]
    assert late.decision == "keep" and late.url is not None
    ids_a[late.url] = late.page_id
    words: dict[str, Any] = {"url": {"url": "http://a.example/2"}, "host": {"host":
                             "B.example"}, "before": {"before": "2026-02-01"},
                             "all": {"all": True}}[how]
    what = selector(namespace="a", **words)
    if scope is None:
        what = Forget(None, what.url, what.url_key, what.host, what.before, what.all)
    keys = check_invariants(a.index)
    gone = set(other.forget(what))  # a third instance (the operator's), on no namespace
    chosen = {"url": {"http://a.example/2"}, "host": {"http://b.example/3",
              "http://b.example/4", "http://b.example/5"}, "before": set(PAGES_OF_URLS),
              "all": {*PAGES_OF_URLS, "http://b.example/5"}}[how]
    want = {ids_a[u] for u in chosen} | ({ids_b[u] for u in chosen if u in ids_b}
                                         if scope is None else set())
    assert gone == want
    assert not gone & set(check_invariants(a.index))
    client = a.index.client
    for q in gone:  # out of every key it joined (not left for readers to sweep)
        ref, page_keys = keys[q]
        for key in page_keys:
            assert ref not in set_members(client.get(_bucket(key)), key)
    assert other.forget(what) == []  # nothing left to forget
    for dd, ids in ((a, ids_a), (b, ids_b)):
        for u, n in PAGES_OF:
            d = again(dd, u, n)
            if ids[u] in want:  # as if never seen
                assert (d.decision, d.reason) == ("keep", "unique"), (u, d)
            else:
                assert d.decision == "drop", (dd.settings.namespace, u, d)
    pages = {ns: v["pages"] for ns, v in a.index.namespaces().items()}
    # 9 held, less those forgotten, plus those of them fetched again (under new URLs)
    assert sum(pages.values()) == len(a.index) == 9 - len(want & {late.page_id})
    check_invariants(a.index)


PAGES_OF_URLS = [u for u, _ in PAGES_OF]


def test_a_url_forgotten_by_its_key_in_its_namespace_only(make: Any) -> None:
    """--url is a point lookup of the URL's key in one namespace: its version there."""
    a, b = make(namespace="a"), make(namespace="b")
    ids_a, ids_b = fill(a), fill(b)
    newer = a.check_batch([page("http://a.example/2", 9)])[0]  # a new version of the URL
    assert newer.decision == "keep" and newer.previous is not None
    assert a.forget(selector(namespace="a", url="http://a.example/2")) == [newer.page_id]
    assert a.forget(selector(namespace="a", url="http://a.example/2")) == []
    assert again(b, "http://a.example/2", 2).decision == "drop"
    assert ids_b["http://a.example/2"] not in a.forget(selector(namespace="c", url=
                                                               "http://a.example/2"))
    assert len(a.index) == 7 and ids_a
    check_invariants(a.index)


def test_stats_count_pages_bytes_and_namespaces(make: Any, url: str) -> None:
    a, b = make(namespace="a"), make()
    fill(a)
    fill(b)
    stats = a.index.stats()
    assert "namespaces" not in stats  # a scan: not in what metrics read after a batch
    spaces = a.index.namespaces()
    assert stats["pages"] == 8 and spaces["a"]["pages"] == 4 and spaces[""]["pages"] == 4
    assert stats["index_bytes"] > 0
    assert stats["index_bytes_per_page"] == stats["index_bytes"] / 8
    assert "records_bytes" not in stats
    b.forget(selector(host="a.example"))
    stats = a.index.stats()
    assert stats["pages"] == 6 and a.index.namespaces()[""]["pages"] == 2
    assert a.index.expires_itself


def test_a_records_store_is_read_and_emptied_too(redis_url: str, redis_single_url: str
                                                  ) -> None:
    flush_redis(redis_url)
    flush_redis(redis_single_url)
    dd = Deduplicator(Settings(index="redis", redis_url=redis_url, namespace="a",
                               redis_records_url=redis_single_url))
    try:
        fill(dd)
        stats = dd.index.stats()
        assert stats["records_bytes"] > 0 and dd.index.namespaces()["a"]["pages"] == 4
        store = connect(redis_single_url)
        assert store.dbsize() == 4
        assert len(dd.forget(selector(namespace="a", host="a.example"))) == 2
        assert store.dbsize() == 2
        assert again(dd, "http://a.example/1", 1).reason == "unique"
        assert again(dd, "http://b.example/3", 3).decision == "drop"
        store.close()
        check_invariants(dd.index)
    finally:
        dd.close()


def test_a_forget_under_other_sketch_parameters_is_refused(make: Any, url: str) -> None:
    a = make(namespace="a")
    fill(a)
    with pytest.raises(IndexMismatchError, match="other sketch parameters"):
        make(namespace="a", seed=12345)
    # The Redis now holds an index of other parameters than an instance opened before
    index = a.index
    index.client.set(b"stream-dedup:stamp", b"1:1024:6:128")
    with pytest.raises(IndexMismatchError, match="nothing forgotten"):
        a.forget(selector(namespace="a", all=True))
    assert int(index.client.get(PAGES)) == 4
    index.client.set(b"stream-dedup:stamp", index._stamp_text.encode())
    assert index.namespaces()["a"]["pages"] == 4
    check_invariants(index)


def test_a_forget_while_two_instances_decide(make: Any) -> None:
    """Two instances decide a stream of pages (recrawls of URLs, copies, near copies) of
    two hosts on threads of their own while a third forgets one host again and again.
    Afterwards no page of that host kept before the last forget began is held, and the
    index is whole: every KEEP page's ref in each of its keys, the count the KEEP pages."""
    deciders = [make(namespace="a") for _ in range(2)]
    operator = make(namespace="a")
    rng = random.Random(44)
    urls = [f"http://{h}.example/{i}" for h in ("gone", "stay") for i in range(40)]
    streams = [[page(rng.choice(urls), rng.randrange(120), None) for _ in range(600)]
               for _ in deciders]
    kept: list[tuple[float, int, str]] = []  # (when the batch returned, page id, url)
    forgets: list[tuple[float, int]] = []  # (when it began, pages forgotten)
    done = threading.Event()
    errors: list[BaseException] = []

    def decide(dd: Deduplicator, stream: list[Page]) -> None:
        try:
            for i in range(0, len(stream), 20):
                decisions = dd.check_batch(stream[i : i + 20])
                now = time.monotonic()
                kept.extend((now, d.page_id, d.url or "") for d in decisions
                            if d.decision == "keep")
        except BaseException as exc:
            errors.append(exc)

    def forget() -> None:
        try:
            while not done.is_set():
                began = time.monotonic()
                forgets.append((began, len(operator.forget(selector(namespace="a",
                                                                    host="gone.example")))))
                time.sleep(0.05)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=decide, args=(dd, s)) for dd, s in
               zip(deciders, streams, strict=True)]
    forgetter = threading.Thread(target=forget)
    for t in [*threads, forgetter]:
        t.start()
    for t in threads:
        t.join(300)
    done.set()
    forgetter.join(60)
    assert not errors, errors
    assert len(forgets) >= 3 and sum(n for _, n in forgets) > 0
    last = forgets[-1][0]
    before = {pid for when, pid, u in kept if when < last and host_of(u) == "gone.example"}
    held = set(check_invariants(operator.index))
    assert not before & held, f"{len(before & held)} pages kept before the last forget held"
    assert any(host_of(u) == "stay.example" and pid in held for _, pid, u in kept)


def _bucket(key: bytes) -> bytes:
    return key[: BUCKET_ENDS[int(key[1 : key.index(b"}")])]]


def check_invariants(index: RedisIndex) -> dict[int, tuple[int, list[bytes]]]:
    """Read the whole index as it is stored (not through the code under test): every KEEP
    page has its verification record and its ref in each key it joined, and the count of
    pages held is the number of KEEP pages. The KEEP pages: id -> (ref, keys)."""
    client, layout = index.client, index.layout
    buckets = [b"{%d}P" % s + b.to_bytes(3, "big") for s in range(SHARDS)
               for b in range(layout.record_buckets)]
    pipe = client.pipeline(transaction=False)
    for key in buckets:
        pipe.hgetall(key)
    held: dict[int, int] = {}  # page id -> ref
    for fields in pipe.execute():
        for f, v in fields.items():
            if f != b"~" and v[:1] == b"K":
                held[int.from_bytes(f, "big")] = int.from_bytes(v[5:11], "big")
    assert int(client.get(PAGES) or 0) == len(held)
    ids = list(held)
    pipe = (client if index.records is None else index.records).pipeline(transaction=False)
    for q in ids:
        pipe.get(layout.doc_key(q))
    records = pipe.execute()
    wanted: list[tuple[int, bytes]] = []
    out = {}
    for q, raw in zip(ids, records, strict=True):
        assert raw is not None, f"KEEP page {q} without its verification record"
        keys, _ = layout.probe_shards(doc_probe(decode_doc(raw, q)))
        wanted += [(q, key) for key in keys]
        out[q] = (held[q], keys)
    pipe = client.pipeline(transaction=False)
    for _, key in wanted:
        pipe.get(_bucket(key))
    for (q, key), bucket in zip(wanted, pipe.execute(), strict=True):
        assert held[q] in set_members(bucket, key), f"KEEP page {q} missing from a key"
    return out
