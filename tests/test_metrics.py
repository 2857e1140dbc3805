"""Instrumentation of the pipeline: the observer hook, Metrics, and the read-only check."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import redis
from indexkit import flush_redis
from opskit import free_port, reordered_pair, samples

from stream_dedup import Deduplicator, Page, Rejected, Settings
from stream_dedup.cli.sample import build
from stream_dedup.errors import IndexUnavailable
from stream_dedup.metrics import Metrics
from stream_dedup.pipeline.deduplicator import NullObserver, StageTimes


def _pages(seed: int = 7) -> list[Page]:
    return [Page(p.url, p.html.encode(), (("Content-Type", "text/html"),)) for p in build(seed)]


def _mixed() -> list[Page | Rejected]:
    first, reordered = reordered_pair()
    items: list[Page | Rejected] = [*_pages(), Page("http://r/1", first.encode()),
                                    Page("http://r/2", reordered.encode())]
    items.insert(7, Rejected(None, "bad-json", "line 8", raw=b"{nope"))
    items.append(Page("http://big/", b"<p>" + b"x " * 20000 + b"</p>"))
    return items


def test_would_decide_gives_checks_decision_and_changes_nothing() -> None:
    dd = Deduplicator(Settings(max_page_bytes=30000))
    for item in _mixed():
        if isinstance(item, Rejected):
            dd.reject(item)
            continue
        before = (len(dd.index), dd.snapshot())
        would = dd.would_decide(item)
        assert (len(dd.index), dd.snapshot()) == before
        assert would == dd.would_decide(item)  # asking twice: still nothing stored
        decided = dd.check(item)
        # a question's kept page gets no id, so no cluster of its own either
        assert would == replace(decided, page_id=None,
                                cluster=None if decided.decision == "keep" else decided.cluster)
    assert {"confirmed", "overturned"} <= set(dd.snapshot()["verification"])


def test_would_decide_knows_a_redelivered_page() -> None:
    dd = Deduplicator()
    page = replace(_pages()[0], source="pages/0/17")
    first = dd.check(page)
    assert dd.would_decide(page) == first  # the decision it got, not "a copy of itself"


def test_metrics_count_what_was_decided() -> None:
    metrics = Metrics(Settings(max_page_bytes=30000))
    dd = Deduplicator(Settings(max_page_bytes=30000), observer=metrics)
    items = _mixed()
    decisions = dd.check_batch(items)
    text = metrics.exposition()[0].decode()
    pages = samples(text, "stream_dedup_pages_total")
    expected: dict[str, float] = {}
    for d in decisions:
        key = f'{{decision="{d.decision}",reason="{d.reason}"}}'
        expected[key] = expected.get(key, 0) + 1
    assert {k: v for k, v in pages.items() if v} == expected
    assert samples(text, "stream_dedup_rejects_total") == {
        '{kind="bad-json"}': 1.0, '{kind="too-large"}': 1.0}
    verify = samples(text, "stream_dedup_verify_total")
    assert verify['{outcome="confirmed"}'] == 8 and verify['{outcome="overturned"}'] == 1
    assert samples(text, "stream_dedup_near_precision_estimate")[""] == 8 / 9
    assert metrics.precision_estimate() == 8 / 9
    body_bytes = sum(len(i.body) for i in items if isinstance(i, Page))
    assert sum(samples(text, "stream_dedup_bytes_total").values()) == body_bytes + len(b"{nope")
    counts = samples(text, "stream_dedup_stage_seconds_count")
    assert counts['{stage="verify"}'] == 9  # pages that ran verification
    assert counts['{stage="index"}'] == len(items) - 2  # all but the two rejects
    assert samples(text, "stream_dedup_index_pages")[""] == len(dd.index)
    # the kept pages' sketches, shingle sets and LD signatures, in the memory index's file
    held = [dd.index.doc(row) for row in range(len(dd.index))]
    assert samples(text, "stream_dedup_index_record_file_bytes")[""] == sum(
        4 * d.sketch.shape[0] + 4 + len(d.shingles) + len(d.ld_signature)
        + 1 + len(d.fetched_at or "") for d in held)


def test_precision_is_nan_before_any_verification() -> None:
    text = Metrics().exposition()[0].decode()
    assert str(samples(text, "stream_dedup_near_precision_estimate")[""]) == "nan"


def test_several_instances_in_one_process_do_not_collide() -> None:
    a, b = Metrics(), Metrics()
    Deduplicator(observer=a).check_batch(_pages()[:3])  # unique, exact copy, unique
    assert samples(a.exposition()[0].decode(), "stream_dedup_pages_total")[
        '{decision="keep",reason="unique"}'] == 2
    assert samples(b.exposition()[0].decode(), "stream_dedup_pages_total")[
        '{decision="keep",reason="unique"}'] == 0
    assert "process_cpu_seconds_total" in a.exposition()[0].decode()


def test_the_default_observer_is_a_no_op() -> None:
    dd = Deduplicator()
    assert isinstance(dd.observer, NullObserver)
    dd.observer.page(dd.check(_pages()[0]), 10, StageTimes())


def test_read_only_checks_from_another_thread_do_not_disturb_a_batch() -> None:
    """/v1/check runs in another thread than the batch; the lock keeps both exact."""
    pages = _pages(11) + _pages(12)
    expected = Deduplicator().check_batch(pages)
    dd = Deduplicator()
    stop = threading.Event()
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            while not stop.is_set():
                for p in pages[::7]:
                    dd.would_decide(p)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=ask)
    thread.start()
    try:
        got = [d for start in range(0, len(pages), 10)
               for d in dd.check_batch(pages[start:start + 10])]
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert got == expected


def test_redis_round_trips_and_failures_are_measured_by_operation(redis_url: str) -> None:


    flush_redis(redis_url)
    settings = Settings(index="redis", redis_url=redis_url)
    metrics = Metrics(settings)
    dd = Deduplicator(settings, observer=metrics)
    dd.check_batch([p for p in _mixed() if isinstance(p, Page)][:10])
    text = metrics.exposition()[0].decode()
    counts = samples(text, "stream_dedup_redis_seconds_count")
    for op in ("register", "read", "claim"):
        assert counts[f'{{operation="{op}"}}'] >= 1, op
    assert sum(samples(text, "stream_dedup_redis_errors_total").values()) == 0
    dd.index.client = redis.Redis(port=free_port(), socket_connect_timeout=0.5)  # type: ignore[attr-defined]
    with pytest.raises(IndexUnavailable, match="Redis read failed"):
        dd.check_batch([Page("http://new/", b"<p>not stored yet</p>")])
    text = metrics.exposition()[0].decode()
    assert samples(text, "stream_dedup_redis_errors_total")['{operation="read"}'] == 1
