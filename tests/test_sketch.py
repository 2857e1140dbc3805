"""Shingles, sketches, features and the filter curve they produce."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dedup.core import sketch, theory
from stream_dedup.core.sketch import (
    FAMILIES,
    Params,
    Sketcher,
    jaccard,
    resemblance,
    shingle_set,
    shingle_tops,
)
from stream_dedup.core.tokens import tokenize
from stream_dedup.errors import ConfigError

U64 = st.integers(min_value=0, max_value=2**64 - 1)


@pytest.fixture(scope="module", params=FAMILIES)
def sketcher(request: pytest.FixtureRequest) -> Sketcher:
    return Sketcher(Params(family=request.param, shingle_words=4))


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.lists(U64, min_size=0, max_size=60),
    family=st.sampled_from(FAMILIES),
    w=st.integers(1, 9),
    seed=st.integers(0, 2**32),
)
def test_fast_sketch_equals_reference(tokens: list[int], family: str, w: int, seed: int) -> None:
    sk = Sketcher(Params(family=family, shingle_words=w, seed=seed, groups=3, group_size=5))
    fast = sk.sketch(sk.shingles(np.array(tokens, dtype=np.uint64)))
    assert fast.tolist() == sk.reference_sketch(tokens)


@settings(max_examples=30, deadline=None)
@given(values=st.lists(U64, min_size=1, max_size=200), seed=st.integers(0, 2**32))
def test_sketch_ignores_order_and_repeats(values: list[int], seed: int) -> None:
    sk = Sketcher(Params(seed=seed))
    arr = np.array(values, dtype=np.uint64)
    shuffled = np.random.default_rng(seed).permutation(np.concatenate([arr, arr[::2]]))
    assert sk.sketch(arr).tolist() == sk.sketch(shuffled).tolist()


@settings(max_examples=30, deadline=None)
@given(words=st.lists(st.text(min_size=1, max_size=8), min_size=0, max_size=80))
def test_identical_text_gives_identical_features(words: list[str]) -> None:
    sk = Sketcher(Params())
    text = " ".join(words)
    a = sk.features(sk.sketch(sk.shingles(tokenize(text).hashes)))
    b = sk.features(sk.sketch(sk.shingles(tokenize(text.upper() + " !!").hashes)))
    if text.lower() == text.upper().lower():  # case folding is not always an involution
        assert a.tolist() == b.tolist()


@pytest.mark.parametrize("family", ["affine64", "affine32"])
def test_blocks_do_not_change_the_sketch(family: str) -> None:
    sk = Sketcher(Params(family=family))
    big = np.random.default_rng(3).integers(0, 2**63, size=20_000, dtype=np.uint64)
    x = big.reshape(1, -1)
    if family == "affine64":
        h = (sk._a * x + sk._b) >> np.uint64(32)
    else:
        low = np.uint64(0xFFFFFFFF)
        h = ((sk._a & low) * (x >> np.uint64(32)) + (sk._b & low)) & low
    expected = np.min(h.astype(np.uint32), axis=1)
    assert sk.sketch(big).tolist() == sk.sketch_numpy(big).tolist() == expected.tolist()


def test_features_depend_on_every_group_member_and_on_params() -> None:
    sk = Sketcher(Params())
    sketch = np.arange(84, dtype=np.uint32)
    base = sk.features(sketch)
    assert len(set(base.tolist())) == 6
    changed = sketch.copy()
    changed[15] += 1  # group 1
    diff = sk.features(changed) != base
    assert diff.tolist() == [False, True, False, False, False, False]
    other = Sketcher(Params(seed=1)).features(sketch)
    assert not set(other.tolist()) & set(base.tolist())


def test_params_are_validated() -> None:
    with pytest.raises(ConfigError, match="family"):
        Params(family="md5")
    with pytest.raises(ConfigError):
        Params(shingle_words=0)
    assert Params().stamp != Params(shingle_words=5).stamp


def _pair(rng: np.random.Generator, n: int, rho: float) -> tuple[np.ndarray, np.ndarray]:
    """Two sets of n shingles each whose Jaccard resemblance is as close to rho as n allows."""
    common = round(2 * n * rho / (1 + rho))
    pool = rng.integers(0, 2**64 - 1, size=2 * n - common, dtype=np.uint64, endpoint=True)
    return pool[:n], pool[n - common :]


U32 = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=200, deadline=None)
@given(a=st.lists(U32, max_size=80), b=st.lists(U32, max_size=80),
       common=st.lists(U32, max_size=80))
def test_exact_jaccard_is_the_set_jaccard(a: list[int], b: list[int], common: list[int]) -> None:
    """Repeats and order do not count; the value is |A∩B| / |A∪B| of the sets."""
    a, b = a + common, common + b
    tops = lambda xs: shingle_tops(np.array(xs, dtype=np.uint64) << np.uint64(32))  # noqa: E731
    if not a or not b:
        assert tops([]) == b""  # no shingles, no set
        return
    shift, values = shingle_set(tops(a))
    assert shift == 0 and values.tolist() == sorted(set(a))
    expected = len(set(a) & set(b)) / len(set(a) | set(b))
    for kernel in (sketch._native, None):  # the compiled kernel, then the numpy path
        with mock.patch.object(sketch, "_native", kernel):
            assert jaccard(tops(a), tops(b)) == pytest.approx(expected)
            assert jaccard(tops(b), tops(a)) == pytest.approx(expected)


def test_shingle_tops_are_the_fingerprints_top_halves() -> None:
    sk = Sketcher(Params())
    shingles = sk.shingles(tokenize("one two three four five six seven eight nine ten").hashes)
    tops = np.frombuffer(shingle_tops(shingles), dtype="<u4")
    assert tops.tolist() == [0] + [int(x) >> 32 for x in shingles.tolist()]  # text order
    assert len(tops) == 4 and shingle_tops(shingles[:0]) == b""


def test_a_long_page_stores_a_mod_m_sample_compared_at_the_coarser_m(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Over MAX_SET_SHINGLES a page keeps the values = 0 mod 2**shift; a pair is compared
    on the coarser sample, and the Jaccard of samples tracks the sets'."""
    monkeypatch.setattr(sketch, "MAX_SET_SHINGLES", 1000)
    rng = np.random.default_rng(3)
    base = rng.integers(0, 2**64, 8000, dtype=np.uint64)
    big = np.concatenate((base, rng.integers(0, 2**64, 1000, dtype=np.uint64)))
    small = base[:900]
    shift, values = shingle_set(shingle_tops(big))
    assert shift == 4 and 300 < values.shape[0] <= 1000 and not (values & 15).any()
    assert shingle_set(shingle_tops(small))[0] == 0
    sets = [{int(x) >> 32 for x in s.tolist()} for s in (big, small)]
    exact = len(sets[0] & sets[1]) / len(sets[0] | sets[1])
    got = jaccard(shingle_tops(big), shingle_tops(small))
    assert got is not None and abs(got - exact) < 0.03 and got > 0
    assert jaccard(shingle_tops(small), shingle_tops(big)) == got
    with mock.patch.object(sketch, "_native", None):
        assert jaccard(shingle_tops(small), shingle_tops(big)) == got
    no_sample = np.array([0, 1, 2, 3], "<u4").tobytes()  # none of 1, 2, 3 is 0 mod 16
    assert jaccard(shingle_tops(big), no_sample) is None
    sk = Sketcher(Params())  # the kernel's result is sampled the same way
    words = " ".join(f"w{i}" for i in range(3000))
    t = tokenize(words)
    assert sk.page(t.hashes, t.codepoints)[3] == shingle_tops(sk.shingles(t.hashes))


@pytest.mark.parametrize("words", [3000, 60])
def test_past_sample_shingles_a_page_stores_the_sample_its_sketch_sizes(
        monkeypatch: pytest.MonkeyPatch, words: int) -> None:
    """Past SAMPLE_SHINGLES shingles the shift comes from the sketch's estimate of the
    distinct ones, the same in the kernel and in numpy: ~3,000 distinct shingles are
    sampled down to 250-500, 60 repeated 50 times stay whole (the estimate sees 60)."""
    monkeypatch.setattr(sketch, "SAMPLE_SHINGLES", 500)
    sk = Sketcher(Params())
    text = [f"w{i}" for i in range(words)]
    t = tokenize(" ".join(text if words > 500 else text * 50))
    x = sk.shingles(t.hashes)
    kernel = sk.page(t.hashes, t.codepoints)[3]
    assert kernel == shingle_tops(x, sk.sketch(x))
    with mock.patch.object(sketch, "_native", None):
        assert sk.page(t.hashes, t.codepoints)[3] == kernel
    shift, values = shingle_set(kernel)
    if words > 500:  # 2,993 distinct shingles
        assert shift == 3 and 250 < values.shape[0] <= 500 and not (values & 7).any()
        whole = {int(v) >> 32 for v in x.tolist()}
        assert set(values.tolist()) == {v for v in whole if v & 7 == 0}
    else:
        assert shift == 0 and values.shape[0] == 60 and len(kernel) == 4 + 4 * x.shape[0]


def test_bands_are_validated_and_keyed_apart() -> None:
    with pytest.raises(ConfigError):
        Sketcher(Params(), (22, 4))  # 88 > 84 min-hashes
    sketch = np.arange(84, dtype=np.uint32)
    five, eight = Sketcher(Params(), (5, 4)).keys(sketch), Sketcher(Params(), (8, 4)).keys(sketch)
    assert five[:6].tolist() == eight[:6].tolist() == Sketcher(Params()).features(sketch).tolist()
    assert not set(five[6:].tolist()) & set(eight[6:].tolist())  # layouts never share a key
    assert not set(five[6:].tolist()) & set(five[:6].tolist())


def test_estimated_resemblance_is_unbiased(sketcher: Sketcher) -> None:
    rng = np.random.default_rng(7)
    for rho in (0.2, 0.5, 0.8, 0.95):
        trials = 300
        estimates = []
        for _ in range(trials):
            a, b = _pair(rng, 300, rho)
            estimates.append(resemblance(sketcher.sketch(a), sketcher.sketch(b)))
        common = round(2 * 300 * rho / (1 + rho))
        true = common / (600 - common)
        se = theory.sketch_std_error(true, 84) / np.sqrt(trials)
        assert abs(np.mean(estimates) - true) < 4 * se + 1e-3, (rho, np.mean(estimates), true)
        # and the spread of single estimates is the binomial one
        assert np.std(estimates) < 1.3 * theory.sketch_std_error(true, 84) + 0.01


@pytest.mark.parametrize("family", FAMILIES)
def test_filter_curve_matches_theory(family: str) -> None:
    """Share of pairs with >= 2 of 6 shared features per resemblance bucket vs P_{6,14,2}."""
    sk = Sketcher(Params(family=family))
    rng = np.random.default_rng(11)
    trials = 400
    for rho in (0.6, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.99):
        hits = 0
        for _ in range(trials):
            a, b = _pair(rng, 400, rho)
            fa, fb = sk.features(sk.sketch(a)), sk.features(sk.sketch(b))
            hits += int(np.count_nonzero(fa == fb) >= 2)
        common = round(2 * 400 * rho / (1 + rho))
        true_rho = common / (800 - common)
        p = theory.acceptance(true_rho, 6, 14, 2)
        tolerance = 4 * np.sqrt(p * (1 - p) / trials) + 0.01
        assert abs(hits / trials - p) <= tolerance, (rho, hits / trials, p)
