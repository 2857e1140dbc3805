"""The filter's acceptance probability (Broder, CPM 2000, section 3).

Two pages of resemblance rho agree on one group of s min-hashes with probability rho**s,
so the chance that they share at least r of k features is

    P_{k,s,r}(rho) = sum_{i=r..k} C(k, i) * rho**(s*i) * (1 - rho**s)**(k - i)
"""

from __future__ import annotations

from math import comb, exp, sqrt

from stream_dedup.errors import ConfigError


def _check(k: int, s: int, r: int) -> None:
    if k < 1 or s < 1:
        raise ConfigError(f"k and s must be >= 1 (got k={k}, s={s})")
    if not 1 <= r <= k:
        raise ConfigError(f"the threshold r must be in 1..k={k}, got r={r}")


def acceptance(rho: float, k: int = 6, s: int = 14, r: int = 2) -> float:
    """P_{k,s,r}(rho): probability that pages of resemblance rho share >= r features."""
    _check(k, s, r)
    if not 0.0 <= rho <= 1.0:
        raise ConfigError(f"resemblance must be in [0, 1], got {rho}")
    p = rho**s
    return sum(comb(k, i) * p**i * (1.0 - p) ** (k - i) for i in range(r, k + 1))


def half_point(k: int = 6, s: int = 14, r: int = 2, tol: float = 1e-9) -> float:
    """The resemblance where P_{k,s,r} = 1/2 (minimizes total error for uniform rho)."""
    _check(k, s, r)
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if acceptance(mid, k, s, r) < 0.5:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def steepest_point(s: int = 14) -> float:
    """rho0 where d/ds (s * rho0**(s-1)) = 0, i.e. s = 1/ln(1/rho0): rho0 = exp(-1/s)."""
    if s < 1:
        raise ConfigError("s must be >= 1")
    return exp(-1.0 / s)


def curve(k: int = 6, s: int = 14, r: int = 2, points: int = 21,
          lo: float = 0.0, hi: float = 1.0) -> list[tuple[float, float]]:
    """(rho, P_{k,s,r}(rho)) on an even grid from `lo` to `hi`."""
    if points < 2:
        raise ConfigError("points must be >= 2")
    if not 0.0 <= lo < hi <= 1.0:
        raise ConfigError(f"the resemblance range must be 0 <= low < high <= 1, got {lo}..{hi}")
    step = (hi - lo) / (points - 1)
    return [(lo + i * step, acceptance(lo + i * step, k, s, r)) for i in range(points)]


def curve_title(k: int, s: int, r: int) -> str:
    """P_{k,s,r} in words, for a plot or a table a reader sees."""
    return f"P(candidate) for {k} features of {s} min-hashes, r = {r}"


def sketch_std_error(rho: float, num_perm: int) -> float:
    """Standard error of the resemblance estimated from num_perm min-hashes."""
    return float(sqrt(rho * (1.0 - rho) / num_perm))


