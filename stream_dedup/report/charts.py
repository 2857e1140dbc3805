"""Charts as inline SVG, drawn here (pure): a report must open from disk, offline, with
nothing fetched. Each mark has a <title>, so hovering it tells its numbers; every text is
escaped (labels are URLs' hosts, input from anyone)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

KEEP, DROP, REJECT, OTHER = "#3b7dd8", "#e07b39", "#b93a4a", "#8a8f98"
W = 640  # drawing width, in the SVG's own units (it scales to its box)


def _svg(height: int, body: list[str], label: str) -> str:
    return (f'<svg class="chart" viewBox="0 0 {W} {height}" role="img" '
            f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
            + "".join(body) + "</svg>")


def _text(x: float, y: float, s: str, anchor: str = "start", cls: str = "t") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}">'
            f"{escape(s)}</text>")


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 or v == int(v) else f"{v:.3g}"


def columns(stacks: Sequence[Sequence[float]], names: Sequence[str], colors: Sequence[str],
            labels: Sequence[str], label: str, *, shares: bool = False,
            marker: float | None = None, marker_text: str = "") -> str:
    """Stacked columns, one a stack; `shares`: each stack as fractions of its total (0-100 %).
    `marker`: a vertical line at that fraction of the width (a bar a value was judged by)."""
    height, top, left, bottom = 220, 14, 44, 34
    plot_w, plot_h = W - left - 8, height - top - bottom
    totals = [sum(s) for s in stacks]
    peak = 1.0 if shares else max(totals, default=0) or 1.0
    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{W - 8}" y2="{top + plot_h}" '
            'class="axis"/>']
    for frac in (0.0, 0.5, 1.0):
        y = top + plot_h * (1 - frac)
        body.append(_text(left - 4, y + 4, f"{frac:.0%}" if shares else _fmt(peak * frac),
                          "end"))
    n = max(len(stacks), 1)
    step = plot_w / n
    for i, (stack, total) in enumerate(zip(stacks, totals, strict=True)):
        y = top + plot_h
        tip = f"{labels[i] if i < len(labels) else ''}: " + ", ".join(
            f"{name} {_fmt(v)}" for name, v in zip(names, stack, strict=True))
        for v, color in zip(stack, colors, strict=True):
            if v <= 0:
                continue
            h = plot_h * (v / total if shares and total else v / peak)
            y -= h
            body.append(f'<rect x="{left + i * step + 0.5:.1f}" y="{y:.1f}" '
                        f'width="{max(step - 1, 0.8):.1f}" height="{h:.1f}" fill="{color}">'
                        f"<title>{escape(tip)}</title></rect>")
    if 0 < len(labels) <= 8:  # few columns: each labelled
        body += [_text(left + (i + 0.5) * step, height - bottom + 16, s, "middle")
                 for i, s in enumerate(labels)]
    elif labels:
        body.append(_text(left, height - bottom + 16, labels[0]))
        body.append(_text(W - 8, height - bottom + 16, labels[-1], "end"))
    if marker is not None:
        x = left + plot_w * marker
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" '
                    'class="marker"/>')
        body.append(_text(x + 3, top + 10, marker_text))
    body += _legend(names, colors, height - 6)
    return _svg(height, body, label)


def rows(items: Sequence[tuple[str, Sequence[float]]], names: Sequence[str],
         colors: Sequence[str], label: str, *, shares: bool = False) -> str:
    """Horizontal stacked bars, one a labelled row (hosts)."""
    line, left, top = 20, 210, 6
    height = top + line * len(items) + 26
    plot_w = W - left - 60
    peak = 1.0 if shares else max((sum(v) for _, v in items), default=0) or 1.0
    body = []
    for i, (name, stack) in enumerate(items):
        y = top + i * line
        shown = name if len(name) <= 32 else name[:31] + "…"
        body.append(_text(left - 6, y + 14, shown, "end"))
        total = sum(stack)
        x = float(left)
        tip = f"{name}: " + ", ".join(f"{n} {_fmt(v)}" for n, v in zip(names, stack,
                                                                        strict=True))
        for v, color in zip(stack, colors, strict=True):
            if v <= 0:
                continue
            w = plot_w * (v / total if shares and total else v / peak)
            body.append(f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{line - 6}" '
                        f'fill="{color}"><title>{escape(tip)}</title></rect>')
            x += w
        body.append(_text(x + 4, y + 14, _fmt(total)))
    body += _legend(names, colors, height - 6)
    return _svg(height, body, label)


def _legend(names: Sequence[str], colors: Sequence[str], y: float) -> list[str]:
    out, x = [], 44.0
    for name, color in zip(names, colors, strict=True):
        out.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{color}"/>')
        out.append(_text(x + 14, y, name))
        x += 22 + 7 * len(name)
    return out


def histogram(series: Sequence[tuple[str, Sequence[float], str]], label: str, *,
              low: float = 0.0, bins: int = 40, marker: float | None = None) -> str:
    """Values in [low, 1] counted in `bins` equal bins, one stacked colour a series."""
    width = (1.0 - low) / bins
    stacks = [[0.0] * len(series) for _ in range(bins)]
    for s, (_, values, _) in enumerate(series):
        for v in values:
            b = min(int((v - low) / width), bins - 1) if v >= low else 0
            stacks[b][s] += 1
    labels = [f"{low + b * width:.3f}–{low + (b + 1) * width:.3f}" for b in range(bins)]
    labels[0], labels[-1] = f"{low:g}", "1"
    at = None if marker is None or not low <= marker <= 1 else (marker - low) / (1 - low)
    return columns(stacks, [n for n, _, _ in series], [c for _, _, c in series], labels, label,
                   marker=at, marker_text=f"bar {marker:g}" if marker is not None else "")
