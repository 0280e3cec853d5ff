"""Metric outliers: the node farthest from the others, in the bad direction, persisting over windows."""

from __future__ import annotations

import numpy as np
import pytest

from stalwart.diagnosis import EvidenceBundle, NodeMetrics, diagnose
from stalwart.diagnosis.metric_outliers import NAMED_SCORE, OutlierConfig, metric_outliers


def fleet(n: int, samples: int, seed: int = 0, **overrides: dict[int, list[float | None]]) -> list[NodeMetrics]:
    """n nodes with noisy but healthy step time, throughput and temperature; `overrides` replace one
    metric's series on some nodes."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        series: dict[str, list[float | None]] = {
            "step_time_s": list(1.0 + 0.02 * rng.standard_normal(samples)),
            "tokens_per_second": list(8000 + 150 * rng.standard_normal(samples)),
            "gpu_temperature_c": list(60 + 1.5 * rng.standard_normal(samples)),
        }
        for metric, per_node in overrides.items():
            if i in per_node:
                series[metric] = per_node[i]
        out.append(NodeMetrics(node=f"node-{i}", series=series))
    return out


def test_a_persistently_slow_node_is_named_with_the_metrics_that_point_to_it() -> None:
    slow_steps: list[float | None] = [1.0] * 10 + [1.6] * 20
    slow_tps: list[float | None] = [8000.0] * 10 + [5000.0] * 20
    f = metric_outliers(fleet(32, 30, step_time_s={7: slow_steps}, tokens_per_second={7: slow_tps}))
    assert list(f.node_scores) == ["node-7"]
    assert {m.metric for m in f.ranking} == {"step_time_s", "tokens_per_second"}
    assert all(m.node == "node-7" and m.windows >= 3 for m in f.ranking)


def test_direction_matters() -> None:
    fast: list[float | None] = [0.5] * 30  # half the step time of the others: not a fault
    high_tps: list[float | None] = [12000.0] * 30
    f = metric_outliers(fleet(16, 30, step_time_s={3: fast}, tokens_per_second={3: high_tps}))
    assert f.node_scores == {}
    hot: list[float | None] = [85.0] * 30
    assert list(metric_outliers(fleet(16, 30, gpu_temperature_c={3: hot})).node_scores) == ["node-3"]


def test_a_blip_does_not_name_a_node() -> None:
    blip: list[float | None] = [1.0] * 14 + [3.0] + [1.0] * 15  # a window's median ignores one bad sample
    burst: list[float | None] = [1.0] * 12 + [3.0] * 2 + [1.0] * 16  # ... and two
    f = metric_outliers(fleet(16, 30, step_time_s={2: blip, 9: burst}), OutlierConfig(window=5, persist=5))
    assert f.node_scores == {}
    # three bad samples in a row sway three windows (the median of 5): fewer than five in a row
    short: list[float | None] = [1.0] * 12 + [3.0] * 3 + [1.0] * 15
    assert metric_outliers(fleet(16, 30, step_time_s={9: short}), OutlierConfig(window=5, persist=5)).node_scores == {}
    assert list(
        metric_outliers(fleet(16, 30, step_time_s={9: short}), OutlierConfig(window=5, persist=3)).node_scores
    ) == ["node-9"]
    longer: list[float | None] = [1.0] * 12 + [3.0] * 12 + [1.0] * 6
    assert list(metric_outliers(fleet(16, 30, step_time_s={9: longer})).node_scores) == ["node-9"]


def test_missing_values_and_short_series() -> None:
    gaps: list[float | None] = [None if i % 3 == 0 else 1.7 for i in range(30)]
    f = metric_outliers(fleet(8, 30, step_time_s={4: gaps, 5: [None] * 30}))
    assert list(f.node_scores) == ["node-4"]  # a node that measures nothing is not an outlier
    assert metric_outliers(fleet(8, 3)).node_scores == {}  # shorter than a window
    assert metric_outliers(fleet(2, 30, step_time_s={0: [5.0] * 30})).node_scores == {}  # no "others" to compare


def test_tiny_differences_on_a_tight_fleet_are_not_faults() -> None:
    nodes = [NodeMetrics(node=f"n{i}", series={"step_time_s": [1.0] * 20}) for i in range(10)]
    nodes[4] = NodeMetrics(node="n4", series={"step_time_s": [1.02] * 20})  # 2%: MAD is 0, but it is noise
    assert metric_outliers(nodes).node_scores == {}


@pytest.mark.parametrize("kind", ["metrics", "auto"])
def test_the_engine_reports_a_slowdown_from_metrics(kind: str) -> None:
    slow: list[float | None] = [1.0] * 5 + [2.5] * 25
    bundle = EvidenceBundle(job="m", kind=kind, metrics=fleet(12, 30, step_time_s={11: slow}))  # type: ignore[arg-type]
    v = diagnose(bundle)
    assert v.failure_class == "slowdown" and v.flagged == ["node-11"] and v.blame == "node"
    assert v.metric_ranking[0].metric == "step_time_s" and v.runbook == "slowdown"
    healthy = diagnose(EvidenceBundle(job="m", kind=kind, metrics=fleet(12, 30)))  # type: ignore[arg-type]
    assert healthy.failure_class == "none" and healthy.flagged == [] and healthy.action == "none"


def test_a_node_out_all_along_in_a_local_phase_outweighs_late_and_host_only_outliers() -> None:
    """As on a starved host: node-2's data loading is slow all along; node-3 (its data-parallel
    peer) waits for it and turns slow in its own phases only lately; node-0's CPU reading differs
    throughout though its phases are normal. node-2 alone is named; the others stay leads."""

    def series(base: float, late: float | None = None, n: int = 34, tail: int = 8) -> list[float | None]:
        return [base] * (n - tail) + [base if late is None else late] * tail

    metrics = []
    for i in range(4):
        metrics.append(
            NodeMetrics(
                node=f"node-{i}",
                series={
                    "step_time_s": series(2.2),
                    "data_time_max_s": series(2.0) if i == 2 else series(0.01, 1.0 if i == 3 else None),
                    "other_time_max_s": series(0.02, 0.8 if i == 3 else None),
                    "comm_time_max_s": series(2.0 if i == 3 else 0.05),
                    "cpu_percent": series(70.0 if i == 0 else 40.0),
                },
            )
        )
    f = metric_outliers(metrics)
    assert set(f.node_scores) == {"node-0", "node-2", "node-3"}
    v = diagnose(EvidenceBundle(job="m", kind="slowdown", metrics=metrics))
    assert v.failure_class == "slowdown" and v.flagged == ["node-2"], v.suspects
    assert v.suspects[0].node == "node-2"


def test_a_victim_waiting_in_a_collective_is_not_an_outlier_the_slow_rank_is() -> None:
    """Four nodes of two ranks. Rank 5 (node-2) loads its data slowly; its data-parallel peer, rank
    1 (node-0), waits for it in the gradient all-reduce (its comm time, and its node's, is out). The
    slow rank names node-2; node-0's wait weighs nothing, so it is no suspect."""

    def series(value: float, n: int = 24) -> list[float | None]:
        return [value + 0.001 * (i % 3) for i in range(n)]

    metrics = []
    for node in range(4):
        waiting = node == 0
        metrics.append(
            NodeMetrics(
                node=f"node-{node}",
                series={
                    "step_time_s": series(1.0),
                    "comm_time_max_s": series(0.9 if waiting else 0.05),
                    "data_time_max_s": series(0.9 if node == 2 else 0.02),
                },
            )
        )
        for rank in (2 * node, 2 * node + 1):
            own = {"data_time_s": series(0.9 if rank == 5 else 0.02), "other_time_s": series(0.03)}
            metrics.append(NodeMetrics(node=f"node-{node}", rank=rank, series=own))
    f = metric_outliers(metrics)
    assert f.node_scores["node-2"] >= 0.6 and f.node_scores.get("node-0", 0.0) < 0.5, f.node_scores
    assert any(m.rank == 5 and m.metric == "data_time_s" for m in f.ranking)
    v = diagnose(EvidenceBundle(job="m", kind="slowdown", metrics=metrics))
    assert v.flagged == ["node-2"], v.suspects


def test_a_throughput_is_its_step_times_evidence_not_a_second_metric() -> None:
    """tokens/s is a step's tokens over its time: a node out in both for a few windows has shown one
    thing for a few windows, not two things (which would name it)."""
    steps: list[float | None] = [1.0] * 22 + [1.6] * 8
    tps: list[float | None] = [8000.0] * 22 + [5000.0] * 8
    f = metric_outliers(fleet(8, 30, step_time_s={5: steps}, tokens_per_second={5: tps}))
    assert {m.metric for m in f.ranking} == {"step_time_s", "tokens_per_second"}
    assert f.node_scores["node-5"] < NAMED_SCORE


@pytest.mark.parametrize(("slow_samples", "named"), [(11, False), (16, True)])
def test_metrics_alone_name_a_node_in_a_slowdown_only_once_they_persist(slow_samples: int, named: bool) -> None:
    """One metric barely out for a few windows (a loaded host's jitter on one rank) is a lead, not a
    verdict; out for twice the persistence it names the node."""
    slow: list[float | None] = [1.0] * (30 - slow_samples) + [1.3] * slow_samples
    verdict = diagnose(EvidenceBundle(job="j", kind="slowdown", metrics=fleet(8, 30, step_time_s={2: slow})))
    assert (verdict.flagged == ["node-2"]) is named, verdict.summary
    if not named:
        assert verdict.failure_class == "none" and "metrics lean towards node-2" in verdict.summary, verdict.summary


@pytest.mark.parametrize(("runs", "named"), [((6, 7), True), ((4, 4), False)])
def test_persistent_runs_with_a_lull_between_add_up(runs: tuple[int, int], named: bool) -> None:
    """A starved host the scheduler now and then lets breathe: out for a while, back for a few
    samples, out again. Two runs each past the persistence bar (5 windows; a run of n slow samples
    sways n windows of 5) count as long as one run of both (6 + 7 windows: named alone); runs each
    under the bar are jitter, however many."""
    first, second = runs
    slow: list[float | None] = [1.0] * 6 + [1.3] * first + [1.0] * 6 + [1.3] * second + [1.0] * 2
    verdict = diagnose(EvidenceBundle(job="j", kind="slowdown", metrics=fleet(8, len(slow), step_time_s={2: slow})))
    assert (verdict.flagged == ["node-2"]) is named, verdict.summary


def test_the_windows_sparse_median_is_numpys_nanmedian() -> None:
    """Nodes sampled at different steps leave most of a window NaN: the sort-based median gives
    exactly what np.nanmedian gives (NaN where a window has no value)."""
    import warnings

    from stalwart.diagnosis.metric_outliers import _nanmedian_last

    rng = np.random.default_rng(7)
    x = rng.normal(1.0, 0.2, size=(300, 40, 5))
    x[rng.random(x.shape) < 0.7] = np.nan
    x[0, 0, :] = np.nan  # a window with nothing
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.nanmedian(x, axis=-1)
    assert np.array_equal(_nanmedian_last(x), want, equal_nan=True)
