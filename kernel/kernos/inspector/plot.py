"""Line charts as SVG text, in pure Python (no plotting library in the kernel).

:func:`line_chart` draws one series of ``(x, y)`` points with axes, ticks and
a title.  Every piece of text that reaches the SVG (the title, the axis
labels, the tick labels) goes through :func:`html.escape`: titles name
things agents made, and the SVG is shown as HTML in the notebook.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence

__all__ = ["line_chart", "nice_ticks"]

WIDTH = 640
HEIGHT = 220
MARGIN_LEFT = 72
MARGIN_RIGHT = 16
MARGIN_TOP = 28
MARGIN_BOTTOM = 40
MAX_DOTS = 120
"""Points are marked with dots only up to this many (past it, the line says enough)."""


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


def _number(value: object) -> float | None:
    """``value`` as a finite float, or None (for None, a bool, NaN, a string...)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _plain_number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.3g}"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (steps of 1, 2 or 5 times a power of ten) covering
    ``[low, high]``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high < low:
        low, high = high, low
    if high == low:
        return [low]
    raw = (high - low) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(multiple * power for multiple in (1, 2, 5, 10) if multiple * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        if value >= low - step * 1e-9:
            ticks.append(round(value, 12))
        value += step
    return ticks


def line_chart(points: Sequence[tuple[object, object]], *, title: str, x_label: str = "op",
               y_label: str = "", y_format: Callable[[float], str] = _plain_number,
               x_format: Callable[[float], str] = _plain_number, width: int = WIDTH,
               height: int = HEIGHT, empty: str = "No data yet") -> str:
    """An SVG line chart of ``points`` (sorted by x here); ``empty`` is shown when none.

    The y axis starts at zero (sizes and latencies are never negative) unless
    a value is below it.  Points whose coordinates are not finite numbers
    (``None`` from a reply, say) are left out.
    """
    shown = sorted((x, y) for x, y in ((_number(x), _number(y)) for x, y in points)
                   if x is not None and y is not None)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{_text(title)}" '
             'style="font-family: sans-serif; font-size: 11px">',
             f"<title>{_text(title)}</title>",
             f'<text x="{width / 2:.1f}" y="16" text-anchor="middle" '
             f'style="font-size: 13px; font-weight: bold">{_text(title)}</text>']
    if not shown:
        parts.append(f'<text x="{width / 2:.1f}" y="{height / 2:.1f}" text-anchor="middle" '
                     f'fill="#666">{_text(empty)}</text></svg>')
        return "".join(parts)

    left, right = MARGIN_LEFT, width - MARGIN_RIGHT
    top, bottom = MARGIN_TOP, height - MARGIN_BOTTOM
    x_low, x_high = shown[0][0], shown[-1][0]
    y_values = [y for _, y in shown]
    y_low, y_high = min(0.0, min(y_values)), max(y_values)
    y_ticks = nice_ticks(y_low, y_high if y_high > y_low else y_low + 1)
    y_high = max(y_high, y_ticks[-1]) if y_ticks else y_high
    x_ticks = nice_ticks(x_low, x_high, count=6)

    def px(x: float) -> float:
        return left + (x - x_low) / (x_high - x_low) * (right - left) if x_high > x_low \
            else (left + right) / 2

    def py(y: float) -> float:
        return bottom - (y - y_low) / (y_high - y_low) * (bottom - top) if y_high > y_low \
            else bottom

    parts.append(f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#999"/>'
                 f'<line x1="{left}" y1="{top}" x2="{left}" y2="{bottom}" stroke="#999"/>')
    for tick in y_ticks:
        y = py(tick)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" '
                     f'stroke="#eee"/><text x="{left - 6}" y="{y + 4:.1f}" '
                     f'text-anchor="end">{_text(y_format(tick))}</text>')
    for tick in x_ticks:
        if x_high > x_low and tick != int(tick):
            continue  # ops are whole numbers
        x = px(tick)
        parts.append(f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">'
                     f"{_text(x_format(tick))}</text>")
    parts.append(f'<text x="{(left + right) / 2:.1f}" y="{height - 6}" '
                 f'text-anchor="middle" fill="#444">{_text(x_label)}</text>')
    if y_label:
        parts.append(f'<text x="14" y="{(top + bottom) / 2:.1f}" text-anchor="middle" '
                     f'fill="#444" transform="rotate(-90 14 {(top + bottom) / 2:.1f})">'
                     f"{_text(y_label)}</text>")
    coordinates = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in shown)
    parts.append(f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" '
                 f'points="{coordinates}"/>')
    if len(shown) <= MAX_DOTS:
        parts.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="#1f77b4">'
                     f"<title>{_text(x_label)} {_text(x_format(x))}: "
                     f"{_text(y_format(y))}</title></circle>" for x, y in shown)
    parts.append("</svg>")
    return "".join(parts)
