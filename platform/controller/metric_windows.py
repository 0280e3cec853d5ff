"""Per-node metric series for diagnosis, from windows of NodeMetricVector records.

Each agent returns its node's recent vectors with a stack report (`StackReport.metrics`, oldest
first); the controller also keeps the vectors its heartbeats carried. Either becomes one
`NodeMetrics` per node, the series `metric_outliers` compares across nodes: so a slow node is named
by its numbers when its stacks do not tell.

What a step produces (its time, its phases, the throughput that follows from them) is compared
step by step: each agent samples at its own moments, so its n-th sample is not another node's n-th
step, and the steps of a job vary (a checkpoint's, a slow batch's). Side by side by position, one
node's sample of a slow step beside another's of a fast one reads as an outlier where, in
synchronous training, every node took the same time. Host readings are compared by position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stalwart.health.node_vector import PHASE_NAMES
from stalwart.store.records import StackReport

if TYPE_CHECKING:
    from stalwart.diagnosis.models import NodeMetrics

# Fields of a vector that are bookkeeping, not measurements to compare.
NOT_METRICS = frozenset({"node", "at", "step", "workers_running", "gpu_count", "rank_phases"})
# A rank's own work, as its phase times tell (waits for other ranks are in `compute` and `comm`).
RANK_PHASES = ("data", "optimizer", "other")
MAX_SAMPLES = 240  # per series: a few minutes of heartbeats, far below the bundle's limit
# The readings a step produces (the worker SDK's timings, and the throughput derived from them).
STEP_READINGS = frozenset(
    {"step_time_s", "step_time_max_s", "tokens_per_second", "samples_per_second"}
    | {f"{phase}_time{suffix}" for phase in PHASE_NAMES for suffix in ("_s", "_max_s")}
)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def series_of(vectors: Sequence[Mapping[str, Any]]) -> dict[str, list[float | None]]:
    """Metric name -> its values over the window, None where a sample lacks it."""
    window = list(vectors)[-MAX_SAMPLES:]
    names = sorted({k for v in window for k, x in v.items() if k not in NOT_METRICS and _number(x) is not None})
    return {name: [_number(v.get(name)) for v in window] for name in names}


def by_step(windows: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, list[Mapping[str, Any]]] | None:
    """The nodes' samples side by side by step: for every step any node sampled (the newest
    MAX_SAMPLES), each node's first sample of it, or {} where it has none. Only each node's latest
    run of steps counts (a restart that repeats steps starts its run over). None when no sample
    carries a step."""
    firsts: dict[str, dict[int, Mapping[str, Any]]] = {}
    for node, window in windows.items():
        seen: dict[int, Mapping[str, Any]] = {}
        for v in window:
            step = v.get("step")
            if not isinstance(step, int):
                continue
            if seen and step < max(seen):  # steps went back: a restart from a checkpoint
                seen = {s: x for s, x in seen.items() if s < step}
            seen.setdefault(step, v)
        firsts[node] = seen
    steps = sorted(set().union(*firsts.values()))[-MAX_SAMPLES:]
    if not steps:
        return None
    return {node: [seen.get(step, {}) for step in steps] for node, seen in firsts.items()}


def node_metrics(
    reports: Sequence[StackReport], history: Mapping[str, Sequence[Mapping[str, Any]]]
) -> list[NodeMetrics]:
    """One series set per node: its agent's window when the report has one, else the controller's
    own history of its heartbeats' vectors; nodes with neither are left out. A step's readings are
    aligned by step, the host's by position."""
    from stalwart.diagnosis.models import NodeMetrics

    windows: dict[str, Sequence[Mapping[str, Any]]] = {n: list(v) for n, v in history.items() if v}
    windows.update({r.node: r.metrics for r in reports if r.metrics})
    stepped = by_step(windows) or windows
    out = []
    for node in sorted(windows):
        series = {k: v for k, v in series_of(windows[node]).items() if k not in STEP_READINGS}
        series |= {k: v for k, v in series_of(stepped[node]).items() if k in STEP_READINGS}
        if series:
            out.append(NodeMetrics(node=node, series=dict(sorted(series.items()))))
        out += [NodeMetrics(node=node, rank=rank, series=s) for rank, s in sorted(rank_series(stepped[node]).items())]
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
        series = {f"{p}_time_s": [_number(ph.get(p)) for ph in phases] for p in RANK_PHASES}
        series = {name: xs for name, xs in series.items() if any(x is not None for x in xs)}
        if series:
            out[rank] = series
    return out
