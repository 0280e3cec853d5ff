"""Dual-phase replay on a 2-D layout: ByteRobust's groups over the job's machine grid (stages x
data-parallel blocks), each group a runnable smaller copy of the job, and the one bad node found."""

from __future__ import annotations

import pytest

from stalwart.agents.launcher import NodeServices, worker_env
from stalwart.controller.core.replay import conclusion, phase_assignment, replayable
from stalwart.controller.core.replay import plan_phases as plan
from stalwart.spec import Parallelism, Role, TrainingJob, TrainingJobSpec


def spec(replicas: int, procs: int = 2, **parallelism: int) -> TrainingJobSpec:
    role = Role(
        name="trainer",
        replicas=replicas,
        processes_per_node=procs,
        command=["python"],
        parallelism=Parallelism(**parallelism),
    )
    return TrainingJobSpec(roles=[role])


def nodes(n: int) -> list[str]:
    return [f"node-{i}" for i in range(n)]


def test_the_example_layout_replays_pipelines_then_diagonals() -> None:
    """TP 2 x PP 2 x DP 2 on 4 nodes: node-0/1 hold stage 0 of replicas 0/1, node-2/3 stage 1."""
    replay = plan(spec(4, tensor=2, pipeline=2), nodes(4))
    assert all(g.outcome is None for g in replay.horizontal)  # no group is the whole job: the pipelines run
    assert [g.nodes for g in replay.horizontal] == [["node-0", "node-2"], ["node-1", "node-3"]]
    assert [g.nodes for g in replay.vertical] == [["node-0", "node-3"], ["node-1", "node-2"]]
    for bad in nodes(4):
        for group in [*replay.horizontal, *replay.vertical]:
            group.outcome = "failed" if bad in group.nodes else "passed"  # type: ignore[assignment]
        assert conclusion(replay)[0] == bad


@pytest.mark.parametrize("bad", nodes(8))
def test_every_bad_node_of_a_wider_grid_is_found(bad: str) -> None:
    """PP 2 x DP 4 machines (TP 2 inside each): horizontal groups of k = 2 pipelines (m = k x PP = 4
    machines, n = DP / k = 2 groups), vertical groups one diagonal pipeline each."""
    replay = plan(spec(8, tensor=2, pipeline=2), nodes(8))
    assert [len(g.nodes) for g in replay.horizontal] == [4, 4] and [len(g.nodes) for g in replay.vertical] == [2] * 4
    for group in [*replay.horizontal, *replay.vertical]:
        group.outcome = "failed" if bad in group.nodes else "passed"  # type: ignore[assignment]
    node, summary = conclusion(replay)
    assert node == bad and f"{bad} is in both" in summary


def test_a_group_runs_as_a_smaller_copy_of_the_job() -> None:
    """Nodes in stage-major order: node i of a group holds ranks i x procs..; the same TP and PP,
    DP = the group's pipelines."""
    job_spec = spec(8, tensor=2, pipeline=2)
    replay = plan(job_spec, nodes(8))
    group = replay.horizontal[0]
    assignment = phase_assignment("j", job_spec, [group], 7, lambda node: ("127.0.0.1", 4000), created_at=0.0)
    assert [(n.node, n.first_rank, n.world_size) for n in assignment.nodes] == [
        (group.nodes[i], 2 * i, 8) for i in range(4)
    ]
    job = TrainingJob.model_validate(
        {"apiVersion": "stalwart.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"}, "spec": job_spec}
    )
    services = NodeServices(node=group.nodes[3], progress_socket="/s", checkpoint_uri="/c")
    env = worker_env({}, job, assignment, assignment.nodes[3], 1, services)
    assert (env["RANK"], env["WORLD_SIZE"], env["STALWART_TP"], env["STALWART_PP"], env["STALWART_DP"]) == (
        "7",
        "8",
        "2",
        "2",
        "2",
    )


@pytest.mark.parametrize(
    ("job_spec", "slots", "why"),
    [
        (spec(4, tensor=4), nodes(4), "tensor x context slices"),
        (spec(4, pipeline=4), nodes(4), "needs 3 known-good spare machine(s)"),
        (spec(1, procs=2), nodes(1), "at least two nodes"),
    ],
)
def test_a_layout_replay_cannot_split_is_said_so(job_spec: TrainingJobSpec, slots: list[str], why: str) -> None:
    assert why in (replayable(job_spec, slots) or "")
    assert replayable(spec(4, tensor=2, pipeline=2), nodes(4)) is None
