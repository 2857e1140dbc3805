"""The kept-relative metric of bench/kept_relative.py on hand-made outcomes with known scores."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from kept_relative import DROP, KEEP, SKIP, Outcome, kept_relative  # noqa: E402


def matrix(n: int, pairs: dict[tuple[int, int], float], default: float = 0.1) -> np.ndarray:
    j = np.full((n, n), default)
    np.fill_diagonal(j, 1.0)
    for (a, b), v in pairs.items():
        j[a, b] = j[b, a] = v
    return j


def test_scores_of_a_hand_made_stream() -> None:
    j8 = matrix(8, {
        (0, 1): 0.85, (0, 2): 0.97, (1, 2): 0.83,
        (3, 4): 0.40, (0, 4): 0.92, (2, 4): 0.60,
        (1, 5): 0.99, (0, 5): 0.86, (2, 5): 0.88,
        (0, 7): 0.81, (2, 7): 0.79,
    })
    j8[6, :] = j8[:, 6] = np.nan  # a page without text: no J8 with anything
    outcomes = [
        Outcome(KEEP),  # 0
        Outcome(DROP, 0),  # 1: J8 0.85 with the page it names
        Outcome(KEEP),  # 2: missed, best kept match 0 at 0.97 (1 was dropped: not counted)
        Outcome(KEEP),  # 3: unrelated
        Outcome(DROP, 3),  # 4: names a page at J8 0.40, though 0 (0.92) was kept
        Outcome(DROP, 2),  # 5: 0.99 with 1 does not count (1 was dropped); best kept 0.88
        Outcome(SKIP),  # 6: rejected, in no bucket
        Outcome(KEEP),  # 7: missed, best kept 0.81
    ]
    s = kept_relative(outcomes, j8)
    assert (s.kept, s.drops, s.drops_no_j8) == (4, 3, 0)
    assert s.precision == pytest.approx(2 / 3)  # 0.85 and 0.88 yes, 0.40 no
    assert s.drops_below_05 == 1
    # buckets by each page's best J8 with an earlier page THIS system kept
    assert s.bucket_pages == [3, 1, 1]  # 0.8-0.9: pages 1, 5, 7; 0.9-0.95: 4; 0.95-1: 2
    assert s.bucket_dropped == [2, 1, 0]
    assert s.recall[0] == pytest.approx(2 / 3)
    assert s.recall[1] == 1.0
    assert s.recall[2] == 0.0


def test_bucket_edges_and_undefined_drops() -> None:
    j8 = matrix(5, {(0, 1): 0.95, (0, 2): 1.0, (0, 3): 0.9})
    j8[4, :] = j8[:, 4] = np.nan
    j8[4, 4] = np.nan
    j8[0, 4] = j8[4, 0] = np.nan  # e.g. two pages without visible text, an exact copy
    outcomes = [Outcome(KEEP), Outcome(DROP, 0), Outcome(KEEP), Outcome(KEEP),
                Outcome(DROP, 0)]
    s = kept_relative(outcomes, j8)
    # 0.95 and 1.0 are in the last bucket, 0.9 in the middle one; page 2 is kept but
    # page 3's best kept match is max(0.9 with 0, 0.1 with 2) = 0.9
    assert s.bucket_pages == [0, 1, 2]
    assert s.bucket_dropped == [0, 0, 1]
    assert math.isnan(s.recall[0])
    assert s.drops == 2 and s.drops_no_j8 == 1
    assert s.precision == 1.0  # over the one drop with a J8


def test_a_drop_must_name_an_earlier_kept_page() -> None:
    j8 = matrix(3, {})
    with pytest.raises(ValueError, match="not kept"):
        kept_relative([Outcome(KEEP), Outcome(DROP, 0), Outcome(DROP, 1)], j8)
    with pytest.raises(ValueError, match="earlier page"):
        kept_relative([Outcome(KEEP), Outcome(DROP, 2), Outcome(KEEP)], j8)
