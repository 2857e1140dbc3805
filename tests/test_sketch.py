"""Shingles, sketches, features and the filter curve they produce."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dedup.core import theory
from stream_dedup.core.sketch import FAMILIES, Params, Sketcher, resemblance
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
