"""Small inline SVG charts: a histogram and horizontal bars, drawn here in Python.

Why not matplotlib or a JS charting library: the report must open offline as one file,
and a results file is a few numbers per episode. Plain SVG needs no dependency, scales
with the page, and every label goes through :func:`html.escape`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Bar", "bar_chart", "histogram"]

_WIDTH = 420
_HEIGHT = 200
_PAD_LEFT = 44
_PAD_BOTTOM = 36
_PAD_TOP = 12
_PAD_RIGHT = 12


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 0.01:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.1e}"


def _bins(values: Sequence[float], count: int) -> tuple[float, float, list[int]]:
    low, high = min(values), max(values)
    if math.isclose(low, high):
        low, high = low - 0.5, high + 0.5
    width = (high - low) / count
    counts = [0] * count
    for value in values:
        index = min(int((value - low) / width), count - 1)
        counts[index] += 1
    return low, high, counts


def histogram(values: Sequence[float], *, title: str, unit: str = "",
              bins: int = 10, lo: float | None = None, hi: float | None = None) -> str:
    """An SVG histogram of ``values`` (``lo``/``hi`` fix the axis, e.g. rewards 0..1)."""
    head = f'<figure class="plot"><figcaption>{escape(title)}</figcaption>'
    if not values:
        return head + '<p class="empty">no data</p></figure>'
    finite = [v for v in values if math.isfinite(v)]
    if lo is not None and hi is not None:
        finite = [min(max(v, lo), hi) for v in finite] + [lo, hi]
        low, high, counts = _bins(finite, bins)
        counts[0] -= 1  # the two fence posts that fixed the range
        counts[-1] -= 1
    else:
        low, high, counts = _bins(finite, bins)
    plot_w = _WIDTH - _PAD_LEFT - _PAD_RIGHT
    plot_h = _HEIGHT - _PAD_TOP - _PAD_BOTTOM
    top = max(counts) or 1
    bar_w = plot_w / bins
    parts = [f'<svg viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" '
             f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    parts.append(_axes(plot_w, plot_h, top))
    for index, count in enumerate(counts):
        if not count:
            continue
        height = plot_h * count / top
        x = _PAD_LEFT + index * bar_w
        y = _PAD_TOP + plot_h - height
        start = low + index * (high - low) / bins
        end = start + (high - low) / bins
        parts.append(
            f'<rect class="bar" x="{x + 1:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" '
            f'height="{height:.1f}"><title>{escape(_fmt(start))} to {escape(_fmt(end))}'
            f"{escape(unit)}: {count}</title></rect>")
    base = _PAD_TOP + plot_h
    for fraction, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        x = _PAD_LEFT + plot_w * fraction
        label = _fmt(low + (high - low) * fraction) + unit
        parts.append(f'<text class="tick" x="{x:.1f}" y="{base + 14}" '
                     f'text-anchor="{anchor}">{escape(label)}</text>')
    parts.append(f'<text class="tick" x="{_PAD_LEFT + plot_w / 2:.1f}" y="{_HEIGHT - 4}" '
                 f'text-anchor="middle">{len(values)} episodes</text>')
    parts.append("</svg>")
    return head + "".join(parts) + "</figure>"


def _axes(plot_w: float, plot_h: float, top: int) -> str:
    base = _PAD_TOP + plot_h
    return (f'<line class="axis" x1="{_PAD_LEFT}" y1="{base}" x2="{_PAD_LEFT + plot_w}" '
            f'y2="{base}"/><line class="axis" x1="{_PAD_LEFT}" y1="{_PAD_TOP}" '
            f'x2="{_PAD_LEFT}" y2="{base}"/>'
            f'<text class="tick" x="{_PAD_LEFT - 6}" y="{_PAD_TOP + 4}" '
            f'text-anchor="end">{top}</text>'
            f'<text class="tick" x="{_PAD_LEFT - 6}" y="{base}" text-anchor="end">0</text>')


@dataclass(frozen=True)
class Bar:
    """One row of a bar chart: ``value`` is the full bar, ``part`` the highlighted share
    of it (e.g. the errors among the calls), ``note`` the text after the bar."""

    label: str
    value: float
    part: float = 0.0
    note: str = ""


def bar_chart(bars: Sequence[Bar], *, title: str, legend: tuple[str, str] | None = None
              ) -> str:
    """Horizontal bars, one row per item (long lists are drawn whole: the SVG grows)."""
    head = f'<figure class="plot"><figcaption>{escape(title)}</figcaption>'
    if not bars:
        return head + '<p class="empty">no data</p></figure>'
    row_h = 20
    label_w = 150
    note_w = 150
    plot_w = _WIDTH + 140 - label_w - note_w
    height = _PAD_TOP + row_h * len(bars) + (22 if legend else 6)
    top = max(b.value for b in bars) or 1.0
    parts = [f'<svg viewBox="0 0 {_WIDTH + 140} {height}" role="img" '
             f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">']
    for index, bar in enumerate(bars):
        y = _PAD_TOP + index * row_h
        width = plot_w * bar.value / top
        part = plot_w * min(bar.part, bar.value) / top
        label = bar.label if len(bar.label) <= 22 else bar.label[:21] + "…"
        parts.append(f'<text class="label" x="{label_w - 6}" y="{y + 13}" '
                     f'text-anchor="end"><title>{escape(bar.label)}</title>'
                     f"{escape(label)}</text>")
        parts.append(f'<rect class="bar" x="{label_w}" y="{y + 2}" '
                     f'width="{max(width, 1):.1f}" height="{row_h - 6}"/>')
        if part > 0:
            parts.append(f'<rect class="bar-part" x="{label_w}" y="{y + 2}" '
                         f'width="{part:.1f}" height="{row_h - 6}"/>')
        parts.append(f'<text class="tick" x="{label_w + plot_w + 6}" y="{y + 13}">'
                     f"{escape(bar.note)}</text>")
    if legend:
        y = height - 8
        parts.append(f'<rect class="bar" x="{label_w}" y="{y - 9}" width="10" height="10"/>'
                     f'<text class="tick" x="{label_w + 14}" y="{y}">{escape(legend[0])}</text>'
                     f'<rect class="bar-part" x="{label_w + 90}" y="{y - 9}" width="10" '
                     f'height="10"/><text class="tick" x="{label_w + 104}" y="{y}">'
                     f"{escape(legend[1])}</text>")
    parts.append("</svg>")
    return head + "".join(parts) + "</figure>"
