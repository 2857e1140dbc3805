import pytest

from stream_dedup.core import theory
from stream_dedup.errors import ConfigError


def test_matches_the_numbers_in_broder_2000() -> None:
    # "resemblance greater than 99% do not share at least two features: < 0.00022"
    assert 1 - theory.acceptance(0.99) < 0.00022
    # "resemblance less than 77% do share two or more features: < 0.01"
    assert theory.acceptance(0.77) < 0.01
    # "less than 50% share two or more features: < 0.6e-7"
    assert theory.acceptance(0.50) < 0.6e-7
    # "P_{6,14,2}(x) = 1/2 for x = 0.909..." and "for s = 14 ... rho0 = 0.931..."
    assert theory.half_point() == pytest.approx(0.909, abs=1e-3)
    assert theory.steepest_point(14) == pytest.approx(0.931, abs=1e-3)


def test_edges_and_monotonicity() -> None:
    assert theory.acceptance(0.0) == 0.0
    assert theory.acceptance(1.0) == pytest.approx(1.0)
    values = [p for _, p in theory.curve(points=50)]
    assert values == sorted(values)
    # r = 1 accepts more than r = 2, larger s accepts less
    assert theory.acceptance(0.9, 6, 14, 1) > theory.acceptance(0.9, 6, 14, 2)
    assert theory.acceptance(0.9, 6, 20, 2) < theory.acceptance(0.9, 6, 14, 2)


def test_bad_parameters_are_explained() -> None:
    with pytest.raises(ConfigError, match="threshold r"):
        theory.acceptance(0.5, 6, 14, 7)
    with pytest.raises(ConfigError, match="resemblance"):
        theory.acceptance(1.5)


def test_a_quick_accuracy_run_leaves_the_tracked_curve_alone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """bench/curve.png is the figure RESULTS.md shows; `--quick` (a smoke run) plots to the
    temporary directory instead."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "bench"
    tracked = (bench / "curve.png").read_bytes()
    subprocess.run([sys.executable, str(bench / "accuracy.py"), "--quick", "--sections",
                    "curve", "--pairs-per-bucket", "2"], check=True, capture_output=True,
                   env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=300)
    assert (bench / "curve.png").read_bytes() == tracked
    assert (tmp_path / "stream-dedup-curve-quick.png").read_bytes()[:4] == b"\x89PNG"
