"""Metrics into diagnosis, agent side: per-rank phase times in the node vector, a bounded window per
node, and the window as the diagnosis engine reads it (a slow data loader is named by its metrics)."""

from __future__ import annotations

import pytest

from stalwart.agents.metrics_history import MetricsHistory
from stalwart.controller.core.metric_windows import node_metrics
from stalwart.diagnosis.engine import diagnose
from stalwart.diagnosis.models import EvidenceBundle, Topology
from stalwart.health.node_vector import node_metric_vector
from stalwart.store.records import PhaseTimes, StackReport, WorkerState, WorkerStatus


def worker(
    rank: int,
    data: float,
    compute: float = 0.2,
    comm: float = 0.05,
    optimizer: float = 0.02,
    step_time: float = 0.4,
    step: int = 10,
) -> WorkerStatus:
    return WorkerStatus(
        local_rank=rank % 2,
        rank=rank,
        pid=100 + rank,
        state=WorkerState.RUNNING,
        started_at=0.0,
        step=step,
        step_time=step_time,
        phases=PhaseTimes(data=data, compute=compute, optimizer=optimizer, comm=comm, other=0.01),
    )


def test_the_vector_has_each_phases_mean_and_max_over_the_nodes_ranks() -> None:
    v = node_metric_vector("node-2", [worker(4, data=0.5), worker(5, data=0.1)], now=1.0)
    assert (round(v.data_time_s or 0, 6), v.data_time_max_s) == (0.3, 0.5)
    assert (v.compute_time_s, v.optimizer_time_max_s, v.comm_time_s, v.other_time_s) == (0.2, 0.02, 0.05, 0.01)
    assert node_metric_vector("node-0", [], now=1.0).data_time_s is None  # nothing measured, nothing said


def test_the_window_is_bounded_oldest_first_and_told_by_generation() -> None:
    history = MetricsHistory(size=3)
    for at in range(5):
        history.add(node_metric_vector("node-0", [], now=float(at)), generation=1 if at < 4 else 2)
    assert [v.at for v in history.window()] == [2.0, 3.0, 4.0]
    assert [r["at"] for r in history.as_records(1)] == [2.0, 3.0] and len(history.window(2)) == 1


def windows(culprit_phase: str) -> list[StackReport]:
    """The example's layout (TP 2 x PP 2 x DP 2, two ranks a node) as its agents report it: rank 4 on
    node-2 spends 2 s more per step in `culprit_phase` ("data": a slow loader; "other": the
    slow-worker fault, between steps). Its victims wait for it where their next sync point is:
    node-0 (the stage before it) inside forward and backward, node-1 and node-3 in the DP all-reduce;
    node-0's optimizer is a little slower (a loaded machine's noise)."""
    reports = []
    for n in range(4):
        history = MetricsHistory()
        for t in range(20):  # a heartbeat a step
            slow = t >= 5
            step_time = 2.3 if slow else 0.4
            compute = 2.0 if slow and n == 0 else 0.2
            comm = 2.0 if slow and n in (1, 3) else 0.05
            optimizer = 0.12 if n == 0 else 0.02
            ranks = []
            for rank in (2 * n, 2 * n + 1):
                w = worker(
                    rank, data=0.01, compute=compute, comm=comm, optimizer=optimizer, step_time=step_time, step=t
                )
                if slow and rank == 4:
                    assert w.phases is not None
                    setattr(w.phases, culprit_phase, 2.0)
                ranks.append(w)
            history.add(node_metric_vector(f"node-{n}", ranks, now=float(t)), generation=1)
        reports.append(
            StackReport(
                request_id="r",
                node=f"node-{n}",
                generation=1,
                captured_at=20.0,
                stacks=[],
                metrics=history.as_records(1),
            )
        )
    return reports


@pytest.mark.parametrize("phase", ["data", "other"])
def test_a_node_slow_in_one_phase_is_named_by_its_metrics_not_its_victims(phase: str) -> None:
    """The stacks say nothing here; the metrics name node-2 alone (its victims' waits are explained by it)."""
    reports = windows(phase)
    metrics = node_metrics(reports, {})
    nodes = [m for m in metrics if m.rank is None]
    assert [m.node for m in nodes] == ["node-0", "node-1", "node-2", "node-3"]
    assert len(nodes[2].series["data_time_max_s"]) == 20
    assert not {"at", "step", "workers_running", "rank_phases"} & set(
        nodes[2].series
    )  # what a node is, not how it does
    # ... and each rank's own work, compared with the other ranks'.
    assert [(m.node, m.rank) for m in metrics if m.rank is not None] == [(f"node-{r // 2}", r) for r in range(8)]
    bundle = EvidenceBundle(
        job="j",
        generation=1,
        kind="slowdown",
        topology=Topology(world_size=8, tp=2, pp=2, dp=2, rank_nodes={r: f"node-{r // 2}" for r in range(8)}),
        metrics=metrics,
    )
    verdict = diagnose(bundle)
    assert verdict.flagged == ["node-2"], verdict.summary
    assert any(line.startswith(f"{phase}_time") and "node-2" in line for line in verdict.evidence), verdict.evidence
    assert any(m.rank == 4 and m.metric == f"{phase}_time_s" for m in verdict.metric_ranking), verdict.metric_ranking
    assert node_metrics([StackReport(request_id="r", node="n", generation=1, captured_at=0.0, stacks=[])], {}) == []
