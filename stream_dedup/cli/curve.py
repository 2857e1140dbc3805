"""`stream-dedup curve`: Broder's acceptance curve of a filter's parameters, as a table and,
with matplotlib, a plot (core/theory.py computes it)."""

from __future__ import annotations

import sys
from typing import Any

from stream_dedup.core import theory


def print_curve(k: int, s: int, r: int, points: int, low: float, high: float,
                png: str | None) -> int:
    """The table (and with `png`, the plot) `stream-dedup curve` prints; its exit status."""
    rows = theory.curve(k, s, r, points=points, lo=low, hi=high)
    print(f"{theory.curve_title(k, s, r)}: the probability that pages of resemblance rho "
          f"share >= {r} of {k} features of {s} min-hashes")
    print(f"50% point rho = {theory.half_point(k, s, r):.4f}; steepest for s={s} at "
          f"rho = {theory.steepest_point(s):.4f}")
    print(f"{'rho':>6}  {'P(drop)':>10}")
    for rho, p in rows:
        print(f"{rho:6.3f}  {p:10.6f}  {'#' * round(p * 40)}")
    if png:
        try:
            fig = curve_figure(k, s, r, low, high)
        except ImportError:
            print("stream-dedup: --png needs matplotlib (pip install 'stream-dedup[plot]')",
                  file=sys.stderr)
            return 2
        fig.savefig(png, dpi=120)
        print(f"wrote {png}", file=sys.stderr)
    return 0


def curve_figure(k: int, s: int, r: int, low: float, high: float) -> Any:
    """The acceptance curve over low..high as a matplotlib Figure, its 50 % point marked
    and labelled where it falls in that range. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fine = theory.curve(k, s, r, points=401, lo=low, hi=high)
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.plot([x for x, _ in fine], [y for _, y in fine], label=f"P, k={k} s={s} r={r}")
    half = theory.half_point(k, s, r)
    if low <= half <= high:
        ax.axvline(half, ls=":", c="gray", label=f"50 % at rho = {half:.3f}")
    ax.set(xlabel="resemblance rho", ylabel=f"P(share >= {r} of {k} features)",
           title=theory.curve_title(k, s, r), xlim=(low, high), ylim=(0, 1))
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
