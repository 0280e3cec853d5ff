"""Per-node metric series for diagnosis, from windows of NodeMetricVector records.

Each agent returns its node's recent vectors with a stack report (`StackReport.metrics`, oldest
first); the controller also keeps the vectors its heartbeats carried. Either becomes one
`NodeMetrics` per node, the series `metric_outliers` compares across nodes: so a slow node is named
by its numbers when its stacks do not tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stalwart.store.records import StackReport

if TYPE_CHECKING:
    from stalwart.diagnosis.models import NodeMetrics

# Fields of a vector that are bookkeeping, not measurements to compare.
NOT_METRICS = frozenset({"node", "at", "step", "workers_running", "gpu_count", "rank_phases"})
# A rank's own work, as its phase times tell (waits for other ranks are in `compute` and `comm`).
RANK_PHASES = ("data", "optimizer", "other")
MAX_SAMPLES = 240  # per series: a few minutes of heartbeats, far below the bundle's limit


def number(value: Any) -> float | None:
    """A metric's value as a float; None for what is not a number (a bool included)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def series_of(vectors: Sequence[Mapping[str, Any]]) -> dict[str, list[float | None]]:
    """Metric name -> its values over the window, None where a sample lacks it."""
    window = list(vectors)[-MAX_SAMPLES:]
    names = sorted({k for v in window for k, x in v.items() if k not in NOT_METRICS and number(x) is not None})
    return {name: [number(v.get(name)) for v in window] for name in names}


def node_metrics(
    reports: Sequence[StackReport], history: Mapping[str, Sequence[Mapping[str, Any]]]
) -> list[NodeMetrics]:
    """One series set per node: its agent's window when the report has one, else the controller's
    own history of its heartbeats' vectors; nodes with neither are left out."""
    from stalwart.diagnosis.models import NodeMetrics

    windows: dict[str, Sequence[Mapping[str, Any]]] = {n: list(v) for n, v in history.items() if v}
    windows.update({r.node: r.metrics for r in reports if r.metrics})
    out = []
    for node in sorted(windows):
        series = series_of(windows[node])
        if series:
            out.append(NodeMetrics(node=node, series=series))
        out += [NodeMetrics(node=node, rank=rank, series=s) for rank, s in sorted(rank_series(windows[node]).items())]
    return out


def rank_series(vectors: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, list[float | None]]]:
    """Rank -> its own-work phase times (`data_time_s`, ...) over the window, aligned with the node's
    samples (None where the rank reported nothing), from the vectors' `rank_phases`."""
    window = list(vectors)[-MAX_SAMPLES:]
    ranks = sorted({int(r) for v in window for r in (v.get("rank_phases") or {})})
    out: dict[int, dict[str, list[float | None]]] = {}
    for rank in ranks:
        phases = [
            (v.get("rank_phases") or {}).get(str(rank)) or (v.get("rank_phases") or {}).get(rank) or {} for v in window
        ]
        series = {f"{p}_time_s": [number(ph.get(p)) for ph in phases] for p in RANK_PHASES}
        series = {name: xs for name, xs in series.items() if any(x is not None for x in xs)}
        if series:
            out[rank] = series
    return out
