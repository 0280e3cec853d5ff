"""Elastic data parallelism's sizes as pure functions of the spec: only DP changes, a TP or PP group
leaves whole, and with globalBatchOnResize Keep a rank's share of the declared global batch is split
into even micro-batches of at most microBatch."""

from __future__ import annotations

from typing import Any

import pytest

from stalwart.spec import TrainingJobSpec, parse_job
from stalwart.spec.elastic import elastic, grown_size, rank_batch, resized, shrunk_size, valid_sizes


def spec(role: dict[str, Any], **data: Any) -> TrainingJobSpec:
    doc = {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "el"},
        "spec": {
            "roles": [{"name": "trainer", "command": ["python", "t.py"], **role}],
            "data": {"seqLen": 32, "microBatch": 8, "sources": [{"name": "s", "shards": ["x"]}], **data},
        },
    }
    return parse_job(doc, "test").spec


def test_without_min_replicas_a_role_runs_at_its_replicas_only() -> None:
    s = spec({"replicas": 3, "processesPerNode": 2})
    assert not elastic(s.roles[0]) and valid_sizes(s, s.roles[0]) == [3]
    assert shrunk_size(s, s.roles[0], 2) is None


def test_pure_data_parallelism_shrinks_a_node_at_a_time() -> None:
    s = spec({"replicas": 3, "minReplicas": 2, "processesPerNode": 2})
    role = s.roles[0]
    assert valid_sizes(s, role) == [2, 3]  # DP 6 -> 4 divides the global batch of 48 (12 a rank)
    assert shrunk_size(s, role, 2) == 2 and shrunk_size(s, role, 1) is None  # never below minReplicas
    assert grown_size(s, role, 2, 3) == 3 and grown_size(s, role, 2, 2) is None


def test_a_node_holding_a_pipeline_member_takes_the_whole_pipeline_out() -> None:
    # TP 2 x PP 2 on 2 processes a node: a model replica spans 2 nodes, so sizes go by 2 nodes.
    s = spec({"replicas": 8, "minReplicas": 2, "processesPerNode": 2, "parallelism": {"tensor": 2, "pipeline": 2}})
    role = s.roles[0]
    assert valid_sizes(s, role) == [2, 4, 8]  # DP 1, 2, 4 (DP 3 does not divide the global batch of 32)
    assert shrunk_size(s, role, 7) == 4  # one node lost: its pipeline (and DP's rounding) goes with it
    scaled = spec(
        {"replicas": 8, "minReplicas": 2, "processesPerNode": 2, "parallelism": {"tensor": 2, "pipeline": 2}},
        globalBatchOnResize="Scale",
    )
    assert valid_sizes(scaled, scaled.roles[0]) == [2, 4, 6, 8]  # any whole number of pipelines


def test_expert_parallelism_must_still_divide_data_parallelism() -> None:
    s = spec({"replicas": 4, "minReplicas": 1, "processesPerNode": 1, "parallelism": {"expert": 2}})
    assert valid_sizes(s, s.roles[0]) == [2, 4]


def test_the_spec_at_a_size_changes_replicas_only() -> None:
    s = spec({"replicas": 3, "minReplicas": 2, "processesPerNode": 2})
    small = resized(s, {"trainer": 2})
    assert small.roles[0].replicas == 2 and small.world_size == 4 and small.roles[0].data_parallel == 4
    assert small.roles[0].min_replicas == 2 and small.data == s.data
    assert resized(s, {"trainer": 3}) is s
    with pytest.raises(ValueError, match="cannot run on 0 nodes"):
        resized(s, {"trainer": 0})


@pytest.mark.parametrize(
    ("dp", "expected"),
    [(6, (8, 1)), (4, (6, 2)), (3, (8, 2)), (2, (8, 3)), (1, (8, 6))],
)
def test_keep_splits_a_ranks_share_of_the_global_batch_evenly(dp: int, expected: tuple[int, int]) -> None:
    s = spec({"replicas": 6, "minReplicas": 1, "processesPerNode": 1})
    micro, passes = rank_batch(s, s.roles[0], dp)
    assert (micro, passes) == expected and micro * passes * dp == 48 and micro <= 8


def test_scale_keeps_the_micro_batch_and_keep_refuses_a_size_that_does_not_divide() -> None:
    s = spec({"replicas": 6, "minReplicas": 1, "processesPerNode": 1}, globalBatchOnResize="Scale")
    assert rank_batch(s, s.roles[0], 4) == (8, 1)
    keep = spec({"replicas": 6, "minReplicas": 1, "processesPerNode": 1})
    with pytest.raises(ValueError, match="does not divide the global batch of 48"):
        rank_batch(keep, keep.roles[0], 5)
    assert 5 not in valid_sizes(keep, keep.roles[0])
