"""bench/recall_walk.py's b-bit estimator and its bars on known inputs."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from recall_walk import bbit_estimate, bbit_sd, theory_bar, theory_floor  # noqa: E402


def test_full_hashes_are_the_plain_share() -> None:
    assert bbit_estimate(72, 84, 32) == 72 / 84


@pytest.mark.parametrize(("bits", "matches", "hashes", "want"), [
    (1, 50, 100, 0.0),  # half of 1-bit values agree by chance: no resemblance
    (1, 100, 100, 1.0),
    (1, 90, 100, 0.8),  # (0.9 - 0.5) / 0.5
    (2, 85, 100, 0.8),  # (0.85 - 0.25) / 0.75
    (4, 25, 400, 0.0),  # 1/16 of 400
])
def test_bbit_estimate_removes_the_chance_matches(bits: int, matches: int, hashes: int,
                                                  want: float) -> None:
    assert bbit_estimate(matches, hashes, bits) == pytest.approx(want)


def test_bbit_estimate_is_unbiased_on_simulated_min_hashes() -> None:
    """Equal min-hashes with probability J, else two independent uniform values: the
    estimate from their low b bits averages J."""
    rng = np.random.default_rng(7)
    j, hashes, trials = 0.8, 256, 400
    for bits in (1, 2, 4):
        mask = (1 << bits) - 1
        est = []
        for _ in range(trials):
            a = rng.integers(0, 2**32, hashes, dtype=np.uint64)
            b = np.where(rng.random(hashes) < j, a,
                         rng.integers(0, 2**32, hashes, dtype=np.uint64))
            est.append(bbit_estimate(int(np.count_nonzero((a & mask) == (b & mask))),
                                     hashes, bits))
        assert np.mean(est) == pytest.approx(j, abs=4 * bbit_sd(j, hashes, bits) / trials**0.5)
        assert np.std(est) == pytest.approx(bbit_sd(j, hashes, bits), rel=0.15)


def test_sd_grows_as_bits_shrink() -> None:
    assert bbit_sd(0.8, 84, 32) == pytest.approx(math.sqrt(0.8 * 0.2 / 84))
    assert bbit_sd(0.8, 84, 1) > bbit_sd(0.8, 84, 2) > bbit_sd(0.8, 84, 4) > bbit_sd(0.8, 84, 32)


def test_bar_reproduces_todays_choice() -> None:
    # 0.85 on 84 full hashes accepts m >= 72: the theory bar (2 % at J = 0.75) is 72/84
    assert theory_bar(84, 32) == 72 / 84
    assert theory_bar(512, 2) < theory_bar(256, 2) < theory_bar(84, 2)
    assert theory_floor(256, 2) < 0.8 < theory_bar(256, 2, 0.78)
