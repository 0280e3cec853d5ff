"""Metrics into diagnosis: each node's window of metric vectors becomes its series, and a slow node
the stacks do not single out is named by its metrics, in the finding's evidence."""

from __future__ import annotations

from typing import Any

import pytest
from support.controller_harness import assignment_of

from stalwart.controller.core.metric_windows import node_metrics, series_of
from stalwart.controller.shell import diagnosis as diagnosis_link
from stalwart.logs import get_logger
from stalwart.store.records import StackReport


def vector(node: str, at: float, **metrics: Any) -> dict[str, Any]:
    """A heartbeat's vector, a step a second: sample `at` is of step `at`."""
    return {"node": node, "at": at, "step": int(at), "workers_running": 2, **metrics}


DUMP = """Thread 4242 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2100)
    step (train.py:9)
    <module> (train.py:20)
"""


def report(node: str, window: list[dict[str, Any]]) -> StackReport:
    """Every rank waits in the same all-reduce: the stacks single no one out."""
    first = int(node.rsplit("-", 1)[1]) * 2
    stacks = [{"rank": first + i, "text": DUMP, "method": "py-spy"} for i in range(2)]
    return StackReport(request_id="r", node=node, generation=1, captured_at=0.0, stacks=stacks, metrics=window)


def test_a_window_becomes_series_of_its_measurements() -> None:
    window = [vector("n", 1, step_time_s=0.1, gpu_count=8), vector("n", 2, step_time_s=0.2, data_time_s=0.05)]
    assert series_of(window) == {"data_time_s": [None, 0.05], "step_time_s": [0.1, 0.2]}


def test_agents_windows_win_and_the_controllers_history_fills_in() -> None:
    reports = [report("node-0", [vector("node-0", 1, step_time_s=0.1)]), report("node-1", [])]
    history = {"node-1": [vector("node-1", 1, step_time_s=0.3)], "node-0": [vector("node-0", 1, step_time_s=9.0)]}
    series = {m.node: m.series for m in node_metrics(reports, history)}
    assert series == {"node-0": {"step_time_s": [0.1]}, "node-1": {"step_time_s": [0.3]}}
    assert node_metrics([report("node-0", [])], {}) == []  # no window anywhere: no series, no error


@pytest.mark.parametrize("metric", ["data_time_s", "step_time_max_s"])
def test_a_slow_node_is_named_by_its_metrics_when_every_stack_looks_the_same(
    metric: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [f"node-{i}" for i in range(4)]
    windows = {
        n: [vector(n, t, **{metric: (0.4 if n == "node-2" else 0.02) + 0.001 * (t % 3)}) for t in range(30)]
        for n in nodes
    }
    monkeypatch.setattr(diagnosis_link, "request_stacks", lambda store, job: "r")
    monkeypatch.setattr(diagnosis_link, "collect_stacks", lambda *a, **k: [report(n, windows[n]) for n in nodes])
    assignment = assignment_of(nodes)
    log = get_logger("test")
    found = diagnosis_link.diagnose_slowdown(None, "j", assignment, None, log, rounds=1, interval=0.0)  # type: ignore[arg-type]
    assert found.suspects == ["node-2"]
    assert any(line.startswith(f"metric outlier: {metric} on node-2") for line in found.evidence), found.evidence
    # A hang weighs metrics at half (the stacks are the measurement there): named in the evidence.
    hang = diagnosis_link.diagnose_hang(None, "j", assignment, None, log)  # type: ignore[arg-type]
    assert any(line.startswith(f"metric outlier: {metric} on node-2") for line in hang.evidence), hang.evidence


def test_ranks_are_compared_too_so_a_slow_rank_is_named_among_two_nodes() -> None:
    """Two nodes have no "others" to compare with; their four ranks do. Rank 3 (node-1) spends its
    step outside every phase it measures (a throttled rank between collectives); ranks 0-2 wait for
    it inside their forward and backward (DDP's all-reduce): victims, not outliers."""

    def phases(rank: int, t: int) -> dict[str, float]:
        jitter = 0.002 * ((t + rank) % 3)
        slow = rank == 3
        return {
            "data": 0.01 + jitter,
            "compute": (0.05 if slow else 0.45) + jitter,
            "optimizer": 0.01,
            "comm": 0.01,
            "other": (0.43 if slow else 0.03) + jitter,
        }

    windows = {
        f"node-{n}": [
            vector(f"node-{n}", t, step_time_s=0.5, rank_phases={str(r): phases(r, t) for r in (2 * n, 2 * n + 1)})
            for t in range(20)
        ]
        for n in (0, 1)
    }
    metrics = node_metrics([], windows)
    assert [(m.node, m.rank) for m in metrics] == [
        ("node-0", None),
        ("node-0", 0),
        ("node-0", 1),
        ("node-1", None),
        ("node-1", 2),
        ("node-1", 3),
    ]
    assert set(metrics[5].series) == {"data_time_s", "optimizer_time_s", "other_time_s"}  # own work only
    from stalwart.diagnosis import EvidenceBundle, diagnose

    verdict = diagnose(EvidenceBundle(job="j", kind="slowdown", metrics=metrics))
    assert verdict.flagged == ["node-1"] and "metrics point at node-1" in verdict.summary, verdict.summary
    assert {(m.node, m.rank, m.metric) for m in verdict.metric_ranking} == {("node-1", 3, "other_time_s")}
