"""A small SVG line chart: latency (log scale) against offered load, one panel per
workload, one line per percentile.

Written by hand rather than with a plotting library: the bench's dependencies are
the server's, and an SVG of axes, grid lines and polylines is a few dozen elements.
Every series is a ``<polyline>`` with ``data-series`` (its name) and one ``<circle>``
per point, so a test (or a reader of the file) can find the figures again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

#: Line colours, in series order (distinguishable in grey scale too: dark to light).
COLOURS = ("#1b4f8a", "#d1495b", "#edae49", "#66a182", "#8d6a9f")
WIDTH, HEIGHT = 460, 320  # one panel
LEFT, RIGHT, TOP, BOTTOM = 62, 16, 40, 58  # margins inside a panel


@dataclass
class Line:
    """One series: ``points`` are (x, y) with y > 0 (log scale)."""

    name: str
    points: list[tuple[float, float]]


@dataclass
class Panel:
    title: str
    x_label: str
    lines: list[Line]
    #: A vertical marker (e.g. the closed-loop maximum): (x, label).
    marker: tuple[float, str] | None = None
    notes: list[str] = field(default_factory=list)


def nice_step(span: float, ticks: int = 5) -> float:
    """A 1/2/5 × 10^k step giving about ``ticks`` intervals over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    base = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * base:
            return m * base
    return 10 * base


def _num(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _label(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 1:
        return f"{v:g}"
    return f"{v:.2g}"


def _panel(p: Panel, ox: float) -> list[str]:
    """The elements of one panel whose top-left corner is at x = ``ox``."""
    out: list[str] = []
    x0, x1 = ox + LEFT, ox + WIDTH - RIGHT
    y0, y1 = HEIGHT - BOTTOM, TOP  # y grows downwards
    xs = [x for line in p.lines for x, _ in line.points]
    ys = [y for line in p.lines for _, y in line.points if y > 0]
    if p.marker is not None:
        xs.append(p.marker[0])
    x_max = max(xs, default=1.0) * 1.05 or 1.0
    lo = 10 ** math.floor(math.log10(min(ys))) if ys else 0.1
    hi = 10 ** math.ceil(math.log10(max(ys))) if ys else 10.0
    if hi <= lo:
        hi = lo * 10
    decades = math.log10(hi) - math.log10(lo)

    def sx(x: float) -> float:
        return x0 + (x1 - x0) * x / x_max

    def sy(y: float) -> float:
        return y0 - (y0 - y1) * (math.log10(max(y, lo)) - math.log10(lo)) / decades

    out.append(
        f'<text x="{_num((x0 + x1) / 2)}" y="{TOP - 18}" text-anchor="middle"'
        f' font-weight="bold">{escape(p.title)}</text>'
    )
    # Grid and y ticks: every decade labelled, 2 and 5 as faint lines.
    d = lo
    while d <= hi * 1.0001:
        for m in (1, 2, 5):
            v = d * m
            if v > hi * 1.0001:
                break
            y = _num(sy(v))
            shade = "#bbb" if m == 1 else "#e4e4e4"
            out.append(
                f'<line x1="{_num(x0)}" x2="{_num(x1)}" y1="{y}" y2="{y}" stroke="{shade}"/>'
            )
            if m == 1:
                out.append(
                    f'<text x="{_num(x0 - 6)}" y="{y}" text-anchor="end"'
                    f' dominant-baseline="middle">{_label(v)}</text>'
                )
        d *= 10
    step = nice_step(x_max)
    t = 0.0
    while t <= x_max:
        x = _num(sx(t))
        out.append(f'<line x1="{x}" x2="{x}" y1="{_num(y0)}" y2="{_num(y0 + 5)}" stroke="#444"/>')
        out.append(f'<text x="{x}" y="{_num(y0 + 18)}" text-anchor="middle">{_label(t)}</text>')
        t += step
    out.append(
        f'<polyline points="{_num(x0)},{_num(y1)} {_num(x0)},{_num(y0)} {_num(x1)},{_num(y0)}"'
        ' fill="none" stroke="#444"/>'
    )
    out.append(
        f'<text x="{_num((x0 + x1) / 2)}" y="{HEIGHT - 14}" text-anchor="middle">'
        f"{escape(p.x_label)}</text>"
    )
    cy = (y0 + y1) / 2
    out.append(
        f'<text x="{_num(ox + 16)}" y="{_num(cy)}" text-anchor="middle"'
        f' transform="rotate(-90 {_num(ox + 16)} {_num(cy)})">latency, ms (log scale)</text>'
    )
    if p.marker is not None:
        mx = _num(sx(p.marker[0]))
        out.append(
            f'<line x1="{mx}" x2="{mx}" y1="{_num(y0)}" y2="{_num(y1)}" stroke="#888"'
            ' stroke-dasharray="4 3"/>'
        )
        out.append(
            f'<text x="{mx}" y="{_num(y1 - 4)}" text-anchor="end" fill="#666">'
            f"{escape(p.marker[1])}</text>"
        )
    for k, line in enumerate(p.lines):
        colour = COLOURS[k % len(COLOURS)]
        pts = sorted(pt for pt in line.points if pt[1] > 0)
        coords = " ".join(f"{_num(sx(x))},{_num(sy(y))}" for x, y in pts)
        out.append(
            f'<polyline data-series={quoteattr(line.name)} points="{coords}" fill="none"'
            f' stroke="{colour}" stroke-width="2"/>'
        )
        for px, py in pts:
            out.append(
                f'<circle cx="{_num(sx(px))}" cy="{_num(sy(py))}" r="3" fill="{colour}">'
                f"<title>{escape(line.name)}: {py:.2f} ms at {px:,.0f}</title></circle>"
            )
        ly = y1 + 4 + 16 * k
        out.append(
            f'<line x1="{_num(x0 + 10)}" x2="{_num(x0 + 28)}" y1="{_num(ly)}" y2="{_num(ly)}"'
            f' stroke="{colour}" stroke-width="2"/>'
        )
        out.append(
            f'<text x="{_num(x0 + 33)}" y="{_num(ly)}" dominant-baseline="middle">'
            f"{escape(line.name)}</text>"
        )
    for k, note in enumerate(p.notes):
        out.append(
            f'<text x="{_num(x0)}" y="{HEIGHT - 2 - 12 * (len(p.notes) - 1 - k)}"'
            f' fill="#666" font-size="10">{escape(note)}</text>'
        )
    return out


def _wrap(text: str, chars: int) -> list[str]:
    """Split ``text`` at `` · `` into lines of at most about ``chars`` characters."""
    lines: list[str] = []
    for part in text.split(" · "):
        if lines and len(lines[-1]) + 3 + len(part) <= chars:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return lines


def chart(panels: Sequence[Panel], caption: str = "") -> str:
    """A complete SVG document with ``panels`` side by side, ``caption`` below."""
    width = WIDTH * max(1, len(panels))
    caption_lines = _wrap(caption, int(width / 6)) if caption else []
    height = HEIGHT + 14 * len(caption_lines) + (6 if caption_lines else 0)
    body: list[str] = []
    for k, p in enumerate(panels):
        body += _panel(p, k * WIDTH)
    for k, line in enumerate(caption_lines):
        body.append(
            f'<text x="8" y="{HEIGHT + 14 * (k + 1)}" fill="#666" font-size="10">'
            f"{escape(line)}</text>"
        )
    return "\n".join(
        [
            '<?xml version="1.0" encoding="UTF-8"?>',
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
            f' viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
            f'<rect width="{width}" height="{height}" fill="white"/>',
            *body,
            "</svg>",
            "",
        ]
    )
