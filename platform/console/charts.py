"""Charts and the phase timeline as inline SVG, drawn on the server: no chart library to ship, nothing
for the browser to fetch, and the same picture on a phone and on a wall (the SVG scales).

Only presentation attributes, no style attributes: the pages' Content-Security-Policy forbids inline
styles. Times on the axes are relative ("-5m"), so they need no time zone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup, escape

from stalwart.console.views import Segment, TimelineMark

WIDTH, HEIGHT = 600, 160
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 56, 8, 10, 22


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    magnitude = abs(v)
    if magnitude >= 1e6:
        return f"{v / 1e6:.3g}M"
    if magnitude >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"-{seconds:.0f}s"
    if seconds < 5400:
        return f"-{seconds / 60:.0f}m"
    return f"-{seconds / 3600:.1f}h"


def line_chart(points: Sequence[tuple[float, float]], now: float, *, title: str, percent: bool = False) -> Markup:
    """A line over time; gaps (a None in the series) are left to the caller to drop. At least 2 points."""
    label = escape(title)
    if len(points) < 2:
        return Markup(
            f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{label}: not enough samples">'
            f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="muted">'
            "not enough samples yet</text></svg>"
        )
    t0, t1 = points[0][0], max(points[-1][0], points[0][0] + 1)
    values = [v for _, v in points]
    lo, hi = min(values), max(values)
    if percent:
        lo, hi = min(lo, 0.0), max(hi, 1.0)
    if math.isclose(lo, hi):
        lo, hi = lo - (abs(lo) * 0.1 or 1), hi + (abs(hi) * 0.1 or 1)
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM

    def x(t: float) -> float:
        return PAD_LEFT + (t - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return PAD_TOP + (1 - (v - lo) / (hi - lo)) * plot_h

    path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
    fmt = (lambda v: f"{v * 100:.0f}%") if percent else _fmt
    last = points[-1][1]
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{label}, last {escape(fmt(last))}">',
        f'<line class="axis" x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" y2="{PAD_TOP + plot_h}"/>',
        f'<line class="axis" x1="{PAD_LEFT}" y1="{PAD_TOP + plot_h}" x2="{WIDTH - PAD_RIGHT}" '
        f'y2="{PAD_TOP + plot_h}"/>',
        f'<text class="tick" x="{PAD_LEFT - 4}" y="{PAD_TOP + 8}" text-anchor="end">{escape(fmt(hi))}</text>',
        f'<text class="tick" x="{PAD_LEFT - 4}" y="{PAD_TOP + plot_h}" text-anchor="end">{escape(fmt(lo))}</text>',
        f'<text class="tick" x="{PAD_LEFT}" y="{HEIGHT - 6}">{escape(_ago(now - t0))}</text>',
        f'<text class="tick" x="{WIDTH - PAD_RIGHT}" y="{HEIGHT - 6}" text-anchor="end">'
        f"{escape(_ago(now - points[-1][0]) if now - points[-1][0] >= 1 else 'now')}</text>",
        f'<polyline class="series" fill="none" points="{path}"/>',
        "</svg>",
    ]
    return Markup("".join(parts))


def timeline_svg(segments: Sequence[Segment], marks: Sequence[TimelineMark], start: float, end: float) -> Markup:
    """Generations as green bars, suspensions and the downtime after each failure over them, marks below."""
    width, bar_y, bar_h, height = 1000, 6, 26, 60
    span = max(end - start, 1.0)

    def x(t: float) -> float:
        return max(0.0, min(width, (t - start) / span * width))

    parts = [f'<svg class="timeline" viewBox="0 0 {width} {height}" role="img" aria-label="phase timeline">']
    order = {"pending": 0, "running": 1, "suspended": 2, "down": 3, "finished": 4}
    for seg in sorted(segments, key=lambda s: order.get(s.kind, 9)):
        x0, x1 = x(seg.start), x(seg.end)
        parts.append(
            f'<rect class="seg seg-{escape(seg.kind)}" x="{x0:.1f}" y="{bar_y}" width="{max(x1 - x0, 2):.1f}" '
            f'height="{bar_h}"><title>{escape(seg.label)}</title></rect>'
        )
    for m in marks:
        mx = x(m.at)
        parts.append(
            f'<line class="mark mark-{escape(m.kind)}" x1="{mx:.1f}" y1="{bar_y - 4}" x2="{mx:.1f}" '
            f'y2="{bar_y + bar_h + 4}"><title>{escape(m.label)}</title></line>'
        )
        if m.kind == "generation":
            parts.append(
                f'<text class="tick" x="{mx + 2:.1f}" y="{bar_y + bar_h + 16}">{escape(m.label.split()[-1])}</text>'
            )
    parts.append(f'<text class="tick" x="0" y="{height - 2}">{escape(_ago(end - start))}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
