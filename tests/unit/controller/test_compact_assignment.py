"""The assignment as etcd stores it (issue 23): runs of consecutive nodes, so a generation commit of
10,000 nodes x 8 ranks stays under etcd's 1.5 MiB request limit; the ranks read back are exactly
the ones assigned, for plain, multi-role and replay assignments; the old per-node form still loads.
"""

from __future__ import annotations

import json
import time

from stalwart.controller.core.ranks import RoleWorld, assign
from stalwart.controller.core.replay import phase_assignment
from stalwart.spec import parse_job
from stalwart.spec.model import TrainingJobSpec
from stalwart.store.records import Assignment, JobPhase, JobState, NodeAssignment, ReplayGroupRun

ETCD_REQUEST_LIMIT = 1.5 * 1024 * 1024


def spec(*roles: tuple[str, int, int]) -> TrainingJobSpec:
    doc = {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {
            "roles": [
                {"name": name, "replicas": n, "processesPerNode": procs, "command": ["python", "t.py"]}
                for name, n, procs in roles
            ]
        },
    }
    return parse_job(doc, "test").spec


def stored(assignment: Assignment) -> Assignment:
    return Assignment.loads(assignment.dumps())


def test_ten_thousand_nodes_by_eight_commit_under_etcds_request_limit() -> None:
    nodes = 10_000
    slots = [f"node-{i}" for i in range(nodes)]
    memory = {n: f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:7070" for i, n in enumerate(slots)}
    assignment = assign("j", spec(("trainer", nodes, 8)), slots, 2, ("10.0.0.1", 29500), memory=memory, created_at=0.0)
    state = JobState(
        job="j",
        phase=JobPhase.RUNNING,
        generation=2,
        slots=slots,
        standbys=[f"node-{nodes + i}" for i in range(21)],
        next_node_index=nodes + 21,
        created_at=time.time(),
        updated_at=time.time(),
    )
    size = len(assignment.dumps()) + len(state.dumps())
    assert size < ETCD_REQUEST_LIMIT, size
    assert len(json.loads(assignment.dumps())["runs"]) == 1  # one role, slots in order: one run
    back = stored(assignment)
    assert back == assignment and back.world_size == 80_000
    assert back.for_node("node-9999") == NodeAssignment(
        node="node-9999",
        node_rank=9999,
        role="trainer",
        first_rank=79_992,
        local_world_size=8,
        memory=memory["node-9999"],
    )
    assert back.memory_stores() == memory


def test_a_small_jobs_ranks_are_what_they_always_were() -> None:
    a = stored(assign("j", spec(("trainer", 3, 2)), ["n-0", "n-7", "n-2"], 1, ("h", 1), created_at=0.0))
    assert [(n.node, n.node_rank, n.first_rank, n.local_world_size) for n in a.nodes] == [
        ("n-0", 0, 0, 2),
        ("n-7", 1, 2, 2),
        ("n-2", 2, 4, 2),
    ]
    assert a.rank_nodes() == {0: "n-0", 1: "n-0", 2: "n-7", 3: "n-7", 4: "n-2", 5: "n-2"}
    assert a.memory_stores() == {} and all(n.memory is None for n in a.nodes)


def test_multi_role_and_replay_assignments_read_back_as_assigned() -> None:
    roles = spec(("actor", 2, 4), ("rollout", 3, 2), ("reward", 1, 1))
    worlds = {"actor": RoleWorld("a", 1, 3), "rollout": RoleWorld("b", 2, 1), "reward": RoleWorld("c", 3, 2)}
    slots = ["a0", "a1", "r0", "r1", "r2", "w0"]
    multi = assign("j", roles, slots, 4, ("a", 1), worlds, memory={"a1": "h:1", "r2": "h:2"}, created_at=0.0)
    assert stored(multi).nodes == multi.nodes
    assert len(json.loads(multi.dumps())["runs"]) == 3  # one per role
    rollout = stored(multi).for_node("r1")
    assert rollout is not None and (rollout.role_first_rank, rollout.role_node_rank, rollout.first_rank) == (2, 1, 10)
    groups = [ReplayGroupRun(id="h0", nodes=["a0", "a1"]), ReplayGroupRun(id="h1", nodes=["b0", "b1"])]
    replay = phase_assignment("j", spec(("trainer", 4, 2)), groups, 5, lambda node: (node, 9), created_at=0.0)
    assert stored(replay).nodes == replay.nodes and [n.first_rank for n in replay.nodes] == [0, 2, 0, 2]


def test_an_assignment_stored_per_node_still_loads() -> None:
    a = assign("j", spec(("trainer", 2, 2)), ["x", "y"], 1, ("h", 1), created_at=0.0)
    legacy = json.dumps(a.model_dump(mode="json"))  # how it was stored before runs
    assert "runs" not in legacy and Assignment.loads(legacy) == a
