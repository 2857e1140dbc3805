"""Containment keys (core/contain.py): a page's bottom-q shingles in one random order, of
which a kept page stores the first k and asks with all q; and the `contained` label of a
near drop that is an excerpt. The kernel against the plain definitions; what the keys find;
every backend storing only the k (the same decisions)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from stream_dedup import Deduplicator, Page, Settings
from stream_dedup.core import contain
from stream_dedup.core.sketch import Sketcher, shingle_tops
from stream_dedup.models import Decision

WORDS = [f"v{i}y" for i in range(30000)]


def _html(words: list[str], title: str = "t") -> bytes:
    return (f"<html><head><title>{title}</title></head><body>"
            f"<p>{' '.join(words)}</p></body></html>").encode()


def _words(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(WORDS) for _ in range(n)]


def _tops(values: np.ndarray, shift: int = 0) -> bytes:
    return np.uint32(shift).astype("<u4").tobytes() + values.astype("<u4").tobytes()


@pytest.mark.parametrize("seed", range(6))
def test_the_kernel_numpy_and_the_reference_agree(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for n in (0, 1, 3, 47, 48, 49, 97, 600, 5000):
        values = rng.integers(0, 2**32, n, dtype=np.uint32)
        if n > 4:  # repeated shingles, as a page's text order has them
            values[: n // 4] = values[n // 4 : 2 * (n // 4)]
        tops = _tops(values) if n else b""
        for asked in (1, 4, 48, 256):
            want = contain.contain_keys_reference(tops, asked)
            assert contain.contain_keys(tops, asked).tolist() == want, (n, asked)
            assert contain.contain_keys_numpy(tops, asked).tolist() == want, (n, asked)
            assert len(want) == asked and want == sorted(want)
            for below in (1 << 32, 1 << 29, 1):  # all; a deep key's sample; none
                real = [k for k in contain.contain_keys_reference(tops, asked, below)
                        if k >> 32 == int(contain.CONTAIN_TAG) >> 32]
                assert contain.sample_keys(tops, asked, below).tolist() == real
                deep = [k ^ int(contain.CONTAIN_TAG ^ contain.DEEP_TAG) for k in real]
                assert contain.sample_keys(tops, asked, below,
                                           int(contain.DEEP_TAG)).tolist() == deep


def test_a_sampled_set_has_its_sets_smallest() -> None:
    """The order puts what a MOD-2**s sample keeps first: a page sampled past 8,192
    shingles stores the keys its whole set would give (while the sample holds q)."""
    values = np.random.default_rng(7).integers(0, 2**32, 20000, dtype=np.uint32)
    for shift in (1, 3, 6):
        sample = values[(values & np.uint32((1 << shift) - 1)) == 0]
        assert contain.contain_keys(_tops(sample, shift), 48).tolist() == \
            contain.contain_keys(_tops(values), 48).tolist()


def test_the_sketcher_adds_q_keys_after_the_band_keys() -> None:
    s = Settings()
    sk = Sketcher(s.params, (s.bands, s.band_size), contain=(4, 48))
    hashes = np.random.default_rng(3).integers(0, 2**63, 700, dtype=np.uint64).astype(np.uint64)
    codepoints = np.zeros(10, dtype=np.uint32)
    sketch, keys, _, tops = sk.page(hashes, codepoints)
    assert keys.shape[0] == s.groups + s.bands + 48
    assert keys[-48:].tolist() == contain.contain_keys(tops, 48).tolist()
    assert sk.keys(sketch, tops).tolist() == keys.tolist()
    assert tops == shingle_tops(sk.shingles(hashes), sketch)


def _reason(d: Decision) -> tuple[str, str]:
    return d.decision, d.reason


def test_a_kept_page_stores_contain_keys_of_them() -> None:
    dd = Deduplicator()
    s = dd.settings
    d = dd.check(Page("https://a.example/", _html(_words(random.Random(1), 700))))
    assert d.decision == "keep"
    assert dd.index.stats()["feature_entries"] == s.groups + s.bands + s.contain_keys < \
        s.groups + s.bands + s.contain_query_keys


def test_an_article_inside_a_page_three_times_its_size_is_listed() -> None:
    """The asked keys: P finds K's smallest among its own q smallest with chance
    1 - (1 - 1/3)**48 per key; with stored keys alone (q = k) about 1 - (2/3)**4 = 0.8."""
    rng = random.Random(11)
    asked = stored = 0
    for trial in range(20):
        article = _words(rng, 400)
        bigger = _words(rng, 400) + article + _words(rng, 400)
        for q, s in ((48, None), (4, "stored")):
            dd = Deduplicator(Settings(contain_query_keys=q))
            k = dd.check(Page(f"https://k.example/{trial}", _html(article)))
            p = dd.check(Page(f"https://p.example/{trial}", _html(bigger, "p")))
            assert _reason(p) == ("keep", "unique")
            listed = [c.page_id for c in p.contains] == [k.page_id]
            stored += bool(s) and listed
            asked += not s and listed
    assert asked == 20 and stored < 20, (asked, stored)


def test_an_excerpt_near_its_page_is_contained_a_version_stays_near() -> None:
    rng = random.Random(12)
    article = _words(rng, 600)
    dd = Deduplicator()
    first = dd.check(Page("https://a.example/", _html(article)))
    # 5/6 of the article: J8 ~0.83 (a near-duplicate), all of it inside the article
    excerpt = dd.check(Page("https://b.example/", _html(article[50:550], "b")))
    assert _reason(excerpt) == ("drop", "contained"), excerpt
    assert excerpt.duplicate_of is not None and excerpt.duplicate_of.page_id == first.page_id
    assert excerpt.containment == 1.0 and excerpt.jaccard is not None
    assert excerpt.jaccard < 0.9 and excerpt.verified
    # a version: a few words changed, each page >= 0.9 inside the other: `near`
    version = list(article)
    for i in range(0, 600, 150):
        version[i] = "changed"
    near = dd.check(Page("https://c.example/", _html(version, "c")))
    assert near.decision == "drop" and near.reason in ("near", "near-verified"), near
    assert near.containment is None


def _excerpts(seed: int) -> list[Page]:
    """Ten articles, each after 500 words of its page, then 2/3 of it with 10 words of
    another page's, then all of it after 300 words of a third."""
    rng = random.Random(seed)
    pages = []
    for i in range(10):
        article = _words(rng, 300)
        pages += [Page(f"https://n.example/{i}", _html(_words(rng, 500) + article, "n")),
                  Page(f"https://x.example/{i}", _html(article[:200] + _words(rng, 10), "x")),
                  Page(f"https://y.example/{i}", _html(_words(rng, 300) + article, "y"))]
    return pages


def _outcomes(decisions: list[Decision]) -> list[tuple[str, list[str]]]:
    return [(d.reason, [c.url for c in d.contains]) for d in decisions]


def test_every_backend_stores_only_the_k_keys(make_dedup) -> None:  # type: ignore[no-untyped-def]
    """Excerpts found only through keys asked (no deep keys): a backend that stored them (a
    Redis page joining every key it asks) would find more than the memory index does."""
    pages = _excerpts(13)
    asked = Settings(contain_query_keys=48, contain_sample=0)  # (what storing would change)
    want = _outcomes(Deduplicator(asked).check_batch(pages))
    dd = make_dedup(contain_query_keys=48, contain_sample=0)
    assert _outcomes(list(map(dd.check, pages))) == want
    assert sum(r == "contained" for r, _ in want) < 10  # (not every excerpt: chance)


def test_deep_keys_find_every_excerpt(make_dedup) -> None:  # type: ignore[no-untyped-def]
    """The deep keys (a 1/8 sample of a kept page) find each 200-word excerpt of a page of
    800 words, where its 4 keys find a few; the memory index holds them, the LSM and Redis
    indexes none (the decisions without them)."""
    pages = _excerpts(13)
    dd = make_dedup()
    got = _outcomes(list(map(dd.check, pages)))
    if dd.settings.index != "memory":
        assert got == _outcomes(Deduplicator(Settings(contain_sample=0)).check_batch(pages))
        return
    assert got == _outcomes(Deduplicator().check_batch(pages))
    assert sum(r == "contained" for r, _ in got) == 10
