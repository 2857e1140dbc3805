"""The pipeline end to end on pages built here: every reason, order, batch == one by one."""

from __future__ import annotations

import random

import pytest

from stream_dedup import Deduplicator, Page, Rejected, Settings
from stream_dedup.cli.sample import build
from stream_dedup.pipeline import deduplicator as pipeline
from stream_dedup.pipeline.analysis import Analyzer

RNG_WORDS = [f"w{i}x" for i in range(5000)]


def _article(rng: random.Random, words: int = 400) -> list[str]:
    return [rng.choice(RNG_WORDS) for _ in range(words)]


def _html(words: list[str], title: str = "t") -> str:
    return f"<html><head><title>{title}</title></head><body><p>{' '.join(words)}</p></body></html>"


def test_unique_then_exact_then_canonical() -> None:
    dd = Deduplicator()
    words = _article(random.Random(1))
    first = dd.check_html("http://a/1", _html(words))
    assert (first.decision, first.reason, first.page_id) == ("keep", "unique", 0)
    exact = dd.check_html("http://a/2", _html(words))
    assert (exact.decision, exact.reason) == ("drop", "exact")
    assert exact.duplicate_of is not None and exact.duplicate_of.url == "http://a/1"
    canon = dd.check_html(
        "http://a/3", "<div>" + " ".join(w.upper() + "," for w in words) + "</div>"
    )
    assert (canon.decision, canon.reason) == ("drop", "canonical")
    assert canon.duplicate_of is not None and canon.duplicate_of.page_id == 0


def test_near_duplicate_is_dropped_and_verified() -> None:
    rng = random.Random(2)
    words = _article(rng, 1500)
    dd = Deduplicator()
    dd.check_html("http://a/1", _html(words))
    edited = list(words)
    edited[700] = "changed"  # one word: resemblance ~ 0.99
    d = dd.check_html("http://a/2", _html(edited))
    assert (d.decision, d.reason, d.verified) == ("drop", "near", True)
    assert d.shared_features >= 2 and d.resemblance is not None and d.resemblance > 0.9
    assert d.ld_estimate is not None and d.ld_estimate < 0.05 * len(" ".join(words))


def test_unrelated_pages_are_kept() -> None:
    rng = random.Random(3)
    dd = Deduplicator()
    decisions = [dd.check_html(f"http://a/{i}", _html(_article(rng))) for i in range(50)]
    assert {(d.decision, d.reason) for d in decisions} == {("keep", "unique")}
    assert [d.page_id for d in decisions] == list(range(50))


def test_verification_overturns_a_reordered_page() -> None:
    """Same shingles, other order of paragraphs: sketches agree, edit distance does not.
    (Containment off: the reordered page is inside the first, c ~0.99, and is dropped
    `contained` with it on.)"""
    rng = random.Random(4)
    paras = [_article(rng, 300) for _ in range(8)]
    dd = Deduplicator(Settings(threshold=1, verify_min_resemblance=0.5, contain_min=0))
    dd.check_html("http://a/1", "".join(_html(p) for p in paras))
    rng.shuffle(paras)
    d = dd.check_html("http://a/2", "".join(_html(p) for p in paras))
    assert (d.decision, d.reason) == ("keep", "verified-distinct")
    assert d.resemblance is not None and d.resemblance > 0.5
    assert dd.counters.verify["overturned"] == 1


def test_unsampled_candidates_are_dropped_unverified() -> None:
    rng = random.Random(5)
    words = _article(rng, 1500)
    dd = Deduplicator(Settings(verify_rate=0.0))
    dd.check_html("http://a/1", _html(words))
    edited = list(words)
    edited[3] = "x"
    d = dd.check_html("http://a/2", _html(edited))
    assert (d.decision, d.reason, d.verified, d.resemblance) == ("drop", "near", False, None)


def test_short_pages_use_only_exact_layers() -> None:
    dd = Deduplicator()
    a = dd.check_html("http://a/tag/x", _html("no articles tagged x yet".split()))
    b = dd.check_html("http://a/tag/y", _html("no articles tagged y yet".split()))
    assert (a.reason, a.short, b.reason, b.short) == ("unique", True, "unique", True)
    c = dd.check_html("http://a/tag/x2", _html("No articles, tagged X yet!".split()))
    assert (c.decision, c.reason) == ("drop", "canonical")


def test_pages_without_text_are_not_the_same_text() -> None:
    dd = Deduplicator()
    a = dd.check_html("http://a/1", "<html><body><script>app()</script></body></html>")
    b = dd.check_html("http://a/2", "<html><body><img src=x></body></html>")
    assert (a.decision, b.decision) == ("keep", "keep")
    c = dd.check_html("http://a/3", "<html><body><img src=x></body></html>")
    assert (c.decision, c.reason) == ("drop", "exact")


def test_bad_pages_are_rejected_not_raised() -> None:
    dd = Deduplicator(Settings(max_page_bytes=1000))
    big = dd.check(Page(url="http://a/big", body=b"<p>" + b"x " * 1000 + b"</p>"))
    assert (big.decision, big.reason) == ("reject", "too-large")
    bad = dd.reject(Rejected(url=None, kind="bad-json", message="line 3", source="f.jsonl#3"))
    assert (bad.decision, bad.reason, bad.source) == ("reject", "bad-json", "f.jsonl#3")
    weird = dd.check(Page(url="http://a/w", body=bytes(range(256)) * 3))
    assert weird.decision in ("keep", "reject")


def test_sample_crawl_gets_the_expected_decisions() -> None:
    pages = build(seed=7)
    dd = Deduplicator()
    got = [dd.check_html(p.url, p.html) for p in pages]
    assert [(d.decision, d.reason) for d in got] == [p.expected for p in pages]


@pytest.mark.parametrize("workers", [0, 2])
def test_batch_equals_one_by_one(workers: int) -> None:
    from stream_dedup.pipeline.deduplicator import AnalysisPool

    pages = [Page(p.url, p.html.encode(), (("Content-Type", "text/html"),)) for p in build(seed=9)]
    pages.insert(5, pages[0])  # a raw duplicate inside one batch
    items: list[Page | Rejected] = list(pages)
    items.insert(3, Rejected(None, "bad-json", "x"))
    single = Deduplicator()
    expected = [single.reject(i) if isinstance(i, Rejected) else single.check(i) for i in items]
    batched = Deduplicator()
    pool = AnalysisPool(batched.settings, workers) if workers else None
    try:
        if pool is not None:
            assert pool.wait_ready(60)  # else the calling thread would analyse everything
        got = batched.check_batch(items[:20], pool) + batched.check_batch(items[20:], pool)
    finally:
        if pool is not None:
            pool.shutdown()
    assert got == expected


def test_check_batch_refuses_a_pool_that_is_not_an_analysis_pool() -> None:
    from concurrent.futures import ThreadPoolExecutor

    dedup = Deduplicator()
    page = Page("http://a/", b"<p>hello</p>")
    with ThreadPoolExecutor(2) as plain, pytest.raises(TypeError, match="AnalysisPool"):
        dedup.check_batch([page], plain)  # type: ignore[arg-type]


def test_check_batch_refuses_a_pool_built_with_other_settings() -> None:
    from stream_dedup.pipeline.deduplicator import AnalysisPool

    dedup = Deduplicator(Settings())
    pool = AnalysisPool(Settings(shingle_words=5), 2)  # never started: no processes
    with pytest.raises(ValueError, match="shingle_words"):
        dedup.check_batch([Page("http://a/", b"<p>hello</p>")], pool)
    pool.shutdown()


@pytest.mark.parametrize("workers", [1, 0, -2, 2.0, True])
def test_an_analysis_pool_needs_two_workers_or_more(workers: object) -> None:
    from stream_dedup.pipeline.deduplicator import AnalysisPool

    with pytest.raises(ValueError, match="workers >= 2"):
        AnalysisPool(Settings(), workers)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Settings"):
        AnalysisPool({"shingle_words": 8}, 2)  # type: ignore[arg-type]


def test_decision_json_is_one_line_with_the_schema() -> None:
    import json

    d = Deduplicator().check_html("http://a/ü", _html(_article(random.Random(6))))
    line = d.to_json()
    assert "\n" not in line
    obj = json.loads(line)
    assert set(obj) >= {
        "url",
        "decision",
        "reason",
        "duplicate_of",
        "shared_features",
        "resemblance",
        "ld_estimate",
    }
    assert obj["url"] == "http://a/ü"


def test_an_empty_index_given_by_the_caller_is_used() -> None:
    from stream_dedup.index import MemoryIndex

    settings = Settings()
    mine = MemoryIndex(settings.params.stamp)
    dd = Deduplicator(settings, index=mine)
    dd.check_html("http://a/1", _html(_article(random.Random(8))))
    assert len(mine) == 1


def _shared_features(dd: Deduplicator, a: str, b: str) -> int:
    fa = dd.analyzer.analyze(Page("a", a.encode(), (("Content-Type", "text/html"),))).features
    fb = dd.analyzer.analyze(Page("b", b.encode(), (("Content-Type", "text/html"),))).features
    assert fa is not None and fb is not None
    k = dd.settings.groups  # the features; the band keys follow them
    return int((fa[:k] == fb[:k]).sum())


def test_pages_sharing_fewer_than_r_features_are_verified_and_dropped() -> None:
    settings = Settings(threshold=6)  # any pair sharing 1..5 features takes the weak path
    probe = Deduplicator(settings)
    for seed in range(50):  # find an edit that leaves 1..5 of the 6 features shared
        rng = random.Random(100 + seed)
        words = _article(rng, 1500)
        edited = list(words)
        edited[rng.randrange(1500)] = "changed"
        a, b = _html(words), _html(edited)
        if 1 <= _shared_features(probe, a, b) < 6:
            break
    else:
        pytest.fail("no pair sharing 1..5 features in 50 tries")
    dd = Deduplicator(settings)
    dd.check_html("http://a/1", a)
    d = dd.check_html("http://a/2", b)
    assert (d.decision, d.reason, d.verified) == ("drop", "near-verified", True)
    assert d.resemblance is not None and d.resemblance >= 0.8
    off = Deduplicator(settings.replace(verify_single_feature=False))
    off.check_html("http://a/1", a)
    assert off.check_html("http://a/2", b).reason == "contained"  # (one word: c ~0.99)
    off = Deduplicator(settings.replace(verify_single_feature=False, contain_min=0))
    off.check_html("http://a/1", a)
    assert off.check_html("http://a/2", b).reason == "unique"
    unrelated = dd.check_html("http://a/3", _html(_article(random.Random(999), 1500)))
    assert unrelated.reason == "unique"


def _edited_pairs(replaced: int, pairs: int = 20) -> list[tuple[str, str, float]]:
    """(page, edit, exact J8 of their shingle sets): 600 words, `replaced` words 40 apart
    replaced, each removing 8 shingles from either side (6: J = 545/641 = 0.85)."""
    from stream_dedup.core.sketch import Sketcher
    from stream_dedup.core.tokens import tokenize

    sk = Sketcher(Settings().params)
    out = []
    for seed in range(pairs):
        rng = random.Random(5000 + seed)
        words = _article(rng, 600)
        edited = list(words)
        for k in range(replaced):
            edited[20 + 40 * k] = f"edit{k}z"
        sets = [{int(x) >> 32 for x in sk.shingles(tokenize(" ".join(w)).hashes).tolist()}
                for w in (words, edited)]
        out.append((_html(words), _html(edited), len(sets[0] & sets[1]) / len(sets[0] | sets[1])))
    return out


def _dropped(settings: Settings, pairs: list[tuple[str, str, float]]) -> list[object]:
    out = []
    for i, (a, b, _) in enumerate(pairs):
        dd = Deduplicator(settings)
        dd.check_html(f"http://a/{i}", a)
        out.append(dd.check_html(f"http://b/{i}", b))
    return out


def test_bands_and_exact_jaccard_catch_pages_at_j_085() -> None:
    """At J8 0.85 a page shares a feature with chance 0.48 and the 84-hash estimate clears
    0.85 about half the time; a band (0.975) and the exact Jaccard catch nearly every one,
    and report that exact Jaccard."""
    pairs = _edited_pairs(6)
    assert all(abs(j - 545 / 641) < 0.01 for _, _, j in pairs)
    now = _dropped(Settings(), pairs)
    assert sum(d.decision == "drop" for d in now) >= 18
    for d, (_, _, j) in zip(now, pairs, strict=True):
        if d.decision == "drop":
            assert d.reason in ("near", "near-verified") and d.jaccard == pytest.approx(j)
    before = _dropped(Settings(bands=0, verify_exact=False), pairs)
    assert sum(d.decision == "drop" for d in before) <= 12
    assert all(d.jaccard is None for d in before)


def test_exact_jaccard_keeps_pages_below_the_bar() -> None:
    """At J8 0.78 (9 edits) no page is dropped; the 84-hash estimate at the same bar of
    0.80 drops several (its sd at 0.8 is ~0.04)."""
    pairs = _edited_pairs(9)
    assert all(0.77 < j < 0.79 for _, _, j in pairs)
    assert all(d.decision == "keep" for d in _dropped(Settings(), pairs))
    estimate = Settings(verify_exact=False, near_verified_min_resemblance=0.8)
    assert sum(d.decision == "drop" for d in _dropped(estimate, pairs)) >= 3


def test_long_repetitive_pages_are_sampled_by_their_distinct_shingles(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two words repeated past SAMPLE_SHINGLES and MAX_SET_SHINGLES: 2 distinct shingles,
    the same set on both pages, so kept whole (a sample by the raw count was often empty:
    kept as distinct)."""
    from stream_dedup.core import sketch

    monkeypatch.setattr(sketch, "SAMPLE_SHINGLES", 500)
    monkeypatch.setattr(sketch, "MAX_SET_SHINGLES", 1000)
    for seed in range(32):
        r = random.Random(seed)
        per = [f"t{r.randrange(10**9)}x" for _ in range(2)]
        dd = Deduplicator()
        dd.check_html("http://a/", _html(per * 1500))
        d = dd.check_html("http://b/", _html(per * 1505))
        assert (d.decision, d.jaccard) == ("drop", 1.0), seed


def test_another_page_under_the_same_source_gets_its_own_decision() -> None:
    """`source` names where a page came from; it is no cache key: only the same page (same
    source and body) delivered again is answered with the decision it got."""
    rng = random.Random(11)
    dd = Deduplicator()
    a = Page("http://a/1", _html(_article(rng)).encode(), source="feed#1")
    b = Page("http://b/2", _html(_article(rng)).encode(), source="feed#1")
    first, second = dd.check(a), dd.check(b)
    assert (second.url, second.decision, second.reason) == ("http://b/2", "keep", "unique")
    assert second.page_id != first.page_id and len(dd.index) == 2
    assert dd.check(a) == first  # a re-delivery of a: the decision it got
    assert dd.would_decide(b) == second


def test_a_source_that_never_redelivers_is_never_answered_from_memory() -> None:
    """A file read again (by a second replay on the same Deduplicator) is new input: its
    pages are duplicates of the first reading, not re-deliveries of it."""
    rng = random.Random(12)
    dd = Deduplicator()
    page = Page("http://a/1", _html(_article(rng)).encode(), source="a.warc.gz#1")
    first = dd.check_batch([page], redeliveries=False)[0]
    again = dd.check_batch([page], redeliveries=False)[0]
    assert (first.decision, again.decision, again.reason) == ("keep", "drop", "unchanged")
    assert dd.snapshot()["redelivered"] == 0 and len(dd.index) == 1


def test_a_killed_worker_breaks_one_batch_and_new_workers_serve_the_next() -> None:
    import os
    import signal
    from concurrent.futures.process import BrokenProcessPool

    from stream_dedup.pipeline.deduplicator import AnalysisPool, Analyzer

    settings = Settings()
    analyzer = Analyzer(settings)
    pages = [Page(p.url, p.html.encode(), (("Content-Type", "text/html"),))
             for p in build(seed=9)]
    expected = [analyzer.analyze(p) for p in pages]
    with AnalysisPool(settings, 2) as pool:
        assert pool.wait_ready(60)
        for pid in list(pool._executor._processes):  # type: ignore[union-attr]
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(BrokenProcessPool):
            for _ in range(50):  # until the pool has noticed
                pool.analyse(analyzer, pages)
        assert not pool.ready
        assert pool.wait_ready(60) and pool.starts == 2
        got = pool.analyse(analyzer, pages)
    strip = [(a.raw_fp, a.canonical_fp, a.ld_signature, a.error) for a in got]
    assert strip == [(a.raw_fp, a.canonical_fp, a.ld_signature, a.error) for a in expected]
    assert [a.page for a in got] == pages


def _nothing() -> None:
    """A worker initializer that does nothing."""


def _die_halfway_through_a_result() -> None:
    """In a pool's worker: write the first bytes of a result message, then die, as a worker
    the OOM killer takes while it sends a result."""
    import os
    import signal
    import struct
    import sys

    frame = sys._getframe()
    while frame.f_code.co_name != "_process_worker":
        frame = frame.f_back  # type: ignore[assignment]
    writer = frame.f_locals["result_queue"]._writer
    os.write(writer.fileno(), struct.pack("!i", 1000) + b"half")  # 1,000 bytes promised
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_halfway_through_sending_a_result_breaks_the_pool_not_the_caller(
        ) -> None:
    """Python's pool then waits for the rest of the message forever and never says it is
    broken (CI hung on it): the caller's wait must say so, and shutdown must end."""
    import threading
    import time
    from concurrent.futures.process import BrokenProcessPool

    from stream_dedup.workers.pool import pool

    outcome: list[object] = []

    def run() -> None:
        p = pool(2, _nothing)
        try:
            started = time.monotonic()
            try:
                p.result(p.submit(_die_halfway_through_a_result))
            except BrokenProcessPool as exc:
                outcome.append((exc, time.monotonic() - started))
        finally:
            p.shutdown(wait=True)  # its manager thread was stuck reading the half message
        outcome.append("shut down")

    waiter = threading.Thread(target=run, daemon=True)
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive(), f"still waiting after 60 s: {outcome}"
    (exc, seconds), end = outcome
    assert isinstance(exc, BrokenProcessPool) and seconds < 10 and end == "shut down"


def test_a_worker_pool_starts_every_process_it_is_given() -> None:
    """Not one per task submitted while none is idle (Python's way with a forkserver): that
    ran a while on fewer processes than `--workers` asked for."""
    from stream_dedup.workers.pool import pool

    p = pool(3, _nothing)
    try:
        assert len(p._processes) == 3
        for f in [p.submit(_nothing) for _ in range(3)]:  # started before they are stopped
            p.result(f)
    finally:
        p.shutdown(wait=True)


def test_a_copy_of_a_dropped_page_is_decided_again_without_analysing_it_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A near-duplicate is not stored, so a later copy of it is decided again (against the
    index as it is then), from the analysis remembered; with a memo of 1, the body analysed
    since has taken its place and the copy is analysed again."""
    rng = random.Random(5)
    words = _article(rng, 800)
    edited = list(words)
    edited[400] = "changed"
    original = Page("https://a.example/1", _html(words).encode())
    near = Page("https://a.example/2", _html(edited).encode())
    other = Page("https://b.example/1", _html(_article(rng, 800)).encode())
    again = Page("https://c.example/copy", near.body)
    analysed: list[str] = []
    analyze = Analyzer.analyze

    def counting(self: Analyzer, page: Page) -> object:
        analysed.append(page.url)
        return analyze(self, page)

    monkeypatch.setattr(Analyzer, "analyze", counting)
    dd = Deduplicator()
    first = dd.check_batch([original, near])
    assert [d.decision for d in first] == ["keep", "drop"]
    dd.check(other)
    second = dd.check(again)
    assert analysed == [original.url, near.url, other.url]  # the copy: remembered
    assert (second.decision, second.reason, second.duplicate_of, second.resemblance) == (
        first[1].decision, first[1].reason, first[1].duplicate_of, first[1].resemblance)
    monkeypatch.setattr(pipeline, "MEMO_PAGES", 1)
    analysed.clear()
    small = Deduplicator()
    small.check_batch([original, near])
    small.check(other)
    assert small.check(again).decision == "drop"
    assert analysed == [original.url, near.url, other.url, again.url]
