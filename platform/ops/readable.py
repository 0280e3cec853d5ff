"""Numbers, durations, times and rank lists as people read them: the terminal and the console's pages
show the same text for the same value."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping


def duration(seconds: float | None) -> str:
    """12.3s, 4m05s, 3h12m, 2d04h: short enough for a table column."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def ago(t: float | None, now: float | None = None) -> str:
    return "-" if t is None else f"{duration((now or time.time()) - t)} ago"


def clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def num(value: float | None, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.1f}%"


def rank_ranges(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2,5,7-8': a thousand ranks must fit on a line."""
    xs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts) or "-"


def nodes_of(ranks: Iterable[int], rank_nodes: Mapping[int, str] | None) -> str:
    if not rank_nodes:
        return ""
    nodes = sorted({rank_nodes[r] for r in ranks if r in rank_nodes})
    if not nodes:
        return ""
    return " on " + (", ".join(nodes) if len(nodes) <= 4 else f"{', '.join(nodes[:4])} +{len(nodes) - 4} nodes")
