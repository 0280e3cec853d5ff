"""Minder-style metric outliers: the node farthest from the others, persistently.

For each metric, the series of every node are cut into sliding windows; in each window a node's
value is its median over the window, and its distance from the other nodes is a robust z-score
(distance from the median of all nodes over the scaled median absolute deviation). Direction
matters: a step time is bad high, a throughput bad low. A node is named for a metric only when it
is an outlier in `persist` consecutive windows, and its metrics are ranked by how far out it is.
Everything is numpy over a (nodes x samples) matrix: 2,048 nodes x 8 metrics x 120 samples take
milliseconds.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from stalwart.diagnosis.models import MetricScore, NodeMetrics

Direction = Literal["high", "low", "both"]

# Which way is bad, for the metrics of a heartbeat's NodeMetricVector and a few more.
DIRECTIONS: dict[str, Direction] = {
    "step_time_s": "high",
    "step_time_max_s": "high",
    "compute_time_s": "high",
    "compute_time_max_s": "high",
    "data_time_s": "high",
    "data_time_max_s": "high",
    "optimizer_time_s": "high",
    "optimizer_time_max_s": "high",
    # A node the others wait for spends less time blocked than they do; one with a bad link, more.
    "comm_time_s": "both",
    "comm_time_max_s": "both",
    "other_time_s": "high",
    "other_time_max_s": "high",
    "progress_age_s": "high",
    "tokens_per_second": "low",
    "samples_per_second": "low",
    "gpu_utilization_pct": "both",
    "gpu_temperature_c": "high",
    "gpu_memory_used_pct": "both",
    "nic_error_delta": "high",
    "cpu_percent": "both",
    "memory_percent": "high",
}
# A difference smaller than this is not worth naming a node for, however tight the others are.
ABSOLUTE_FLOOR: dict[str, float] = {
    "nic_error_delta": 1.0,
    "gpu_temperature_c": 3.0,
    "cpu_percent": 5.0,
    "gpu_utilization_pct": 5.0,
    "memory_percent": 5.0,
    "gpu_memory_used_pct": 5.0,
    "step_time_s": 0.01,
    "step_time_max_s": 0.01,
    "compute_time_s": 0.01,
    "compute_time_max_s": 0.01,
    "data_time_s": 0.01,
    "data_time_max_s": 0.01,
    "optimizer_time_s": 0.01,
    "optimizer_time_max_s": 0.01,
    "comm_time_s": 0.01,
    "comm_time_max_s": 0.01,
    "other_time_s": 0.01,
    "other_time_max_s": 0.01,
    "progress_age_s": 1.0,
}
RELATIVE_FLOOR = 0.10  # ... nor smaller than 10% of the typical value
# A rank's phase times (the worker SDK's): a difference is worth naming a node for only when it is
# 10% of a step (the nodes' median step time) or more; below that it is scheduling noise.
STEP_SCALED = frozenset(
    f"{phase}_time{suffix}"
    for phase in ("data", "compute", "optimizer", "comm", "other")
    for suffix in ("_s", "_max_s")
)
STEP_TIME = "step_time_s"
# Phases that hold the waits for other ranks (forward and backward hold TP and PP communication,
# DDP's gradient all-reduce; `comm` is waiting itself): in synchronous training the ranks that wait
# for a slow one stand out in them too. When another node is out in a local phase (data, optimizer,
# the rest of the step), they are explained by it and weigh nothing; alone (a throttled GPU, a bad
# link), they name the node.
WAIT_INCLUSIVE = frozenset({"compute_time_s", "compute_time_max_s", "comm_time_s", "comm_time_max_s"})
# The phases a rank spends on its own: a node out in one of them is where the step's time goes.
LOCAL_PHASES = STEP_SCALED - WAIT_INCLUSIVE
# ... and then a host reading (CPU, memory, GPU) of a node whose own phases are normal is a lead.
LEAD_WEIGHT = 0.5
_WORD = {"high": "above", "low": "below", "both": "away from"}
FULL_RUN_FACTOR = 2  # a metric out for 2 x persist windows (in runs of persist or more) counts fully
# Metrics alone name a node at this score: one out for FULL_RUN_FACTOR x persist windows in a row,
# or two out together. Below it they are a lead, worth acting on only beside another.
NAMED_SCORE = 0.6
# Readings that are one measurement under two names: a throughput is the tokens (samples) of a
# step over its time, so a slow node is out in both, and that is one metric's evidence, not two.
FAMILY = {"tokens_per_second": "step_time_s", "samples_per_second": "step_time_s"}


@dataclass(frozen=True)
class OutlierConfig:
    window: int = 5  # samples per window
    stride: int = 1
    persist: int = 5  # consecutive outlier windows before a node is named
    z_threshold: float = 3.5
    min_nodes: int = 3  # with fewer nodes there is no "the others"


@dataclass
class MetricFindings:
    ranking: list[MetricScore] = field(default_factory=list)  # persistent outliers, worst first
    node_scores: dict[str, float] = field(default_factory=dict)  # 0..1
    reasons: dict[str, list[str]] = field(default_factory=dict)
    metrics_seen: int = 0
    windows: int = 0


def _matrix(metrics: Sequence[NodeMetrics], name: str, nodes: list[str]) -> np.ndarray:
    """(nodes x samples), NaN where missing; series of unequal length are aligned on their newest value."""
    series = [m.series.get(name) or [] for m in metrics]
    length = max((len(s) for s in series), default=0)
    out = np.full((len(nodes), length), np.nan)
    for i, s in enumerate(series):
        if s:
            out[i, length - len(s) :] = np.array(s, dtype=float)  # None becomes NaN
    return out


@dataclass
class Units:
    """What is compared (nodes, or ranks of nodes) and, per metric, their (units x samples) values,
    NaN where none; a metric no unit measured has no matrix."""

    nodes: list[str]
    ranks: list[int | None]
    matrices: dict[str, np.ndarray]

    @classmethod
    def of(cls, metrics: Sequence[NodeMetrics]) -> Units:
        nodes = [m.node for m in metrics]
        names = sorted({k for m in metrics for k in m.series})
        return cls(nodes, [m.rank for m in metrics], {name: _matrix(metrics, name, nodes) for name in names})


def _windows(x: np.ndarray, cfg: OutlierConfig) -> np.ndarray:
    """(nodes x windows) of each node's median over each window."""
    n, t = x.shape
    if t < cfg.window:
        return np.empty((n, 0))
    view = np.lib.stride_tricks.sliding_window_view(x, cfg.window, axis=1)[:, :: cfg.stride, :]
    if not np.isnan(x).any():
        return np.median(view, axis=2)  # the common case, several times faster than nanmedian
    return _nanmedian_last(view)


def _nanmedian_last(a: np.ndarray) -> np.ndarray:
    """np.nanmedian over the last (short) axis, NaN where all are NaN: sorting puts the NaN last, so
    the median is in the first `count` values. numpy's own takes a masked-array path that is ten
    times slower on sparse windows (nodes sampled at different steps: most of a window is NaN)."""
    ordered = np.sort(a, axis=-1)
    count = np.count_nonzero(~np.isnan(a), axis=-1)
    low = np.take_along_axis(ordered, np.maximum((count - 1) // 2, 0)[..., None], axis=-1)[..., 0]
    high = np.take_along_axis(ordered, np.maximum(count // 2, 0)[..., None], axis=-1)[..., 0]
    return np.where(count > 0, (low + high) / 2, np.nan)


def _z(
    values: np.ndarray, name: str, direction: Direction, step: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Robust z-scores (bad direction positive) per node and window, and whether each clears the
    floors; `step` (per window, the nodes' median step time) scales the floor of a phase time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(values, axis=0)
        mad = np.nanmedian(np.abs(values - med), axis=0)
    floor = np.maximum(RELATIVE_FLOOR * np.abs(med), ABSOLUTE_FLOOR.get(name, 1e-9))
    if step is not None:
        floor = np.maximum(floor, np.nan_to_num(RELATIVE_FLOOR * step, nan=0.0))
    scale = np.maximum(1.4826 * mad, floor / 3.0)
    dev = values - med
    z = dev / scale
    if direction == "low":
        z, dev = -z, -dev
    elif direction == "both":
        z, dev = np.abs(z), np.abs(dev)
    big = dev >= floor
    return np.nan_to_num(z, nan=0.0), big & ~np.isnan(values)


def _longest_run(flags: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the longest run of True, and the index (exclusive end) of the last such run."""
    n, w = flags.shape
    run = np.zeros(n, dtype=np.int64)
    best = np.zeros(n, dtype=np.int64)
    end = np.zeros(n, dtype=np.int64)
    for j in range(w):  # windows are few (a series' length); nodes are vectorized
        run = np.where(flags[:, j], run + 1, 0)
        better = run >= best
        best = np.where(better, run, best)
        end = np.where(better & (run > 0), j + 1, end)
    return best, end


def _persistent_windows(flags: np.ndarray, persist: int) -> np.ndarray:
    """Per row: the windows in its runs of at least `persist` in a row, added up. A node out for
    two persistent runs with a lull between (a starved host the scheduler now and then lets
    breathe) has been out as long as one out for both in one run."""
    n, w = flags.shape
    run = np.zeros(n, dtype=np.int64)
    total = np.zeros(n, dtype=np.int64)
    for j in range(w + 1):
        ends = ~flags[:, j] if j < w else np.ones(n, dtype=bool)
        total += np.where(ends & (run >= persist), run, 0)
        run = np.where(ends, 0, run + 1)
    return total


def _step_scale(nodes: Units, cfg: OutlierConfig) -> np.ndarray | None:
    """Per window, the nodes' median step time (None when no node reports one)."""
    if STEP_TIME not in nodes.matrices:
        return None
    win = _windows(nodes.matrices[STEP_TIME], cfg)
    if win.shape[1] == 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(win, axis=0)


def _persistent(
    units: Units, cfg: OutlierConfig, step: np.ndarray | None, out: MetricFindings
) -> dict[int, list[MetricScore]]:
    """Unit index -> its metrics that were out for `persist` windows in a row (a unit is a node, or
    a rank when ranks are compared)."""
    nodes = units.nodes
    per_unit: dict[int, list[MetricScore]] = {}
    for name in sorted(units.matrices):
        direction = DIRECTIONS.get(name, "both")
        win = _windows(units.matrices[name], cfg)
        if win.shape[1] == 0:
            continue
        out.metrics_seen += 1
        out.windows = max(out.windows, win.shape[1])
        scale = (
            step[-win.shape[1] :] if step is not None and name in STEP_SCALED and len(step) >= win.shape[1] else None
        )
        z, big = _z(win, name, direction, scale)
        flags = (z >= cfg.z_threshold) & big
        run, end = _longest_run(flags)
        total = _persistent_windows(flags, cfg.persist)
        for i in (int(j) for j in np.flatnonzero(run >= cfg.persist)):
            lo, hi = int(end[i] - run[i]), int(end[i])
            per_unit.setdefault(i, []).append(
                MetricScore(
                    metric=name,
                    node=nodes[i],
                    rank=units.ranks[i],
                    score=round(float(np.mean(z[i, lo:hi])), 2),
                    windows=int(total[i]),
                )
            )
    return per_unit


def _weight(scores: Sequence[MetricScore], full_run: int, local_culprit: bool) -> float:
    """How much a unit's persistent metrics say: each by how long it persisted (full weight at
    `full_run` windows in a row); a quantity's mean and max over a node's ranks are one measurement.
    With a culprit out in a local phase, waits weigh nothing and host readings are leads."""
    family: dict[str, float] = {}
    for m in scores:
        w = min(1.0, m.windows / full_run)
        if local_culprit and m.metric in WAIT_INCLUSIVE:
            w = 0.0
        elif local_culprit and m.metric not in LOCAL_PHASES:
            w *= LEAD_WEIGHT
        key = FAMILY.get(m.metric, m.metric.replace("_max_s", "_s"))
        family[key] = max(family.get(key, 0.0), w)
    return sum(family.values())


def metric_outliers(metrics: Sequence[NodeMetrics], cfg: OutlierConfig | None = None) -> MetricFindings:
    """Nodes compared with nodes, and ranks (the entries with `rank`: their own-work phase times)
    with ranks: a node is named by its own metrics or by a rank of it that is out."""
    nodes = Units.of([m for m in metrics if m.rank is None])
    return outliers_of(nodes, Units.of([m for m in metrics if m.rank is not None]), cfg)


def outliers_of(nodes: Units, ranks: Units | None = None, cfg: OutlierConfig | None = None) -> MetricFindings:
    """`metric_outliers` over matrices already built (a controller that holds 10,000 nodes' series as
    arrays need not turn them into lists and back)."""
    cfg = cfg or OutlierConfig()
    ranks = ranks or Units([], [], {})
    out = MetricFindings()
    step = _step_scale(nodes, cfg) if len(nodes.nodes) else None
    per_node = _persistent(nodes, cfg, step, out) if len(nodes.nodes) >= cfg.min_nodes else {}
    per_rank = _persistent(ranks, cfg, step, out) if len(ranks.nodes) >= cfg.min_nodes else {}
    # When some node or rank is out in a local phase (data, optimizer, the rest of the step), that is
    # where the step's time goes: the waits of its victims are explained, host readings are leads.
    local_runs = [
        m.windows
        for found in (per_node, per_rank)
        for scores in found.values()
        for m in scores
        if m.metric in LOCAL_PHASES
    ]
    # Full weight at FULL_RUN windows in a row or, when a culprit has been out in a local phase for
    # longer, at that run: one that turned out only lately is most likely its victim (or a starved host).
    full_run = max([FULL_RUN_FACTOR * cfg.persist, *local_runs])
    for index, scores in sorted(per_node.items()):
        scores.sort(key=lambda s: -s.score)
        out.ranking.extend(scores)
        node = nodes.nodes[index]
        out.node_scores[node] = round(min(0.95, 0.3 + 0.3 * _weight(scores, full_run, bool(local_runs))), 2)
        out.reasons[node] = [
            f"{s.metric} is {s.score:.1f} robust deviations {_WORD[DIRECTIONS.get(s.metric, 'both')]} "
            f"the other nodes for {s.windows} windows (runs of {cfg.persist} or more in a row)"
            for s in scores[:4]
        ]
    # A rank out in its own work names its node (the stronger of the node's and its ranks' scores).
    for index, scores in sorted(per_rank.items()):
        scores.sort(key=lambda s: -s.score)
        out.ranking.extend(scores)
        node, rank = ranks.nodes[index], ranks.ranks[index]
        score = round(min(0.95, 0.3 + 0.3 * _weight(scores, full_run, bool(local_runs))), 2)
        out.node_scores[node] = max(out.node_scores.get(node, 0.0), score)
        out.reasons.setdefault(node, []).extend(
            f"rank {rank}: {s.metric} is {s.score:.1f} robust deviations {_WORD[DIRECTIONS.get(s.metric, 'both')]} "
            f"the other ranks for {s.windows} windows (runs of {cfg.persist} or more in a row)"
            for s in scores[:2]
        )
    out.ranking.sort(key=lambda s: (-out.node_scores.get(s.node, 0), -s.score))
    return out
