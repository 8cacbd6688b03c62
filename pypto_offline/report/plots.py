"""Inline SVG bar charts: one row per kernel, a few bars per row, a legend, no script.

Made here rather than with a plotting library because the page must hold everything inline and be
byte-identical from build to build; these are a few rectangles and labels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from pypto_offline.offline_compiler.summary import shown

ROW_H, BAR_H, LABEL_W, PLOT_W, VALUE_W = 26, 7, 190, 420, 260
COLOURS = ("#8c8c8c", "#2b7bb9", "#e08a1e")


@dataclass(frozen=True)
class Series:
    name: str
    values: tuple[float | None, ...]  # None: not measured (no bar, said so)


def bar_chart(title: str, labels: list[str], series: list[Series], unit: str,
              fmt=lambda v: shown(v, ",.2f")) -> str:
    """Grouped horizontal bars, scaled to the largest finite value; an infinite value fills the
    row, a missing one draws no bar and reads "not measured"."""
    top = max((v for s in series for v in s.values if _finite(v)), default=0.0) or 1.0
    height = 40 + ROW_H * len(labels) + 24
    width = LABEL_W + PLOT_W + VALUE_W
    parts = [f'<svg class="plot" role="img" aria-label="{escape(title)}" '
             f'xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}">',
             f'<text x="0" y="14" class="plot-title">{escape(title)} ({escape(unit)})</text>']
    for index, (s, colour) in enumerate(zip(series, COLOURS)):
        x = LABEL_W + index * 150
        parts.append(f'<rect x="{x}" y="22" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14}" y="31">{escape(s.name)}</text>')
    for row, label in enumerate(labels):
        y = 40 + row * ROW_H
        parts.append(f'<text x="0" y="{y + 13}">{escape(label)}</text>')
        for index, (s, colour) in enumerate(zip(series, COLOURS)):
            value = s.values[row]
            length = _bar_length(value, top)
            bar_y = y + index * (BAR_H + 1)
            parts.append(f'<rect x="{LABEL_W}" y="{bar_y}" width="{length}" height="{BAR_H}" '
                         f'fill="{colour}"><title>{escape(s.name)}: {fmt(value)} {escape(unit)}'
                         f'</title></rect>')
        parts.append(f'<text x="{LABEL_W + PLOT_W + 6}" y="{y + 13}">'
                     f'{" / ".join(fmt(s.values[row]) for s in series)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _bar_length(value: float | None, top: float) -> int:
    if not value or math.isnan(value):
        return 0  # nothing to draw: zero or not measured
    if not _finite(value):
        return PLOT_W
    return max(1, round(PLOT_W * min(value, top) / top))
