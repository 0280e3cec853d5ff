"""A generation that elastic data parallelism shrank: its workers see the world of the nodes their
assignment names (WORLD_SIZE, STALWART_DP), and, keeping the declared global batch, their share of it
as micro-batch x accumulation."""

from __future__ import annotations

import time

from stalwart import worker_contract as contract
from stalwart.agents.launcher import NodeServices, generation_spec, worker_env
from stalwart.spec import TrainingJob
from stalwart.store.records import Assignment, NodeAssignment

SERVICES = NodeServices(node="node-2", progress_socket="/tmp/p.sock", checkpoint_uri="/ckpt", data_config="{}")


def job(**data: object) -> TrainingJob:
    return TrainingJob.model_validate(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "j"},
            "spec": {
                "roles": [
                    {
                        "name": "trainer",
                        "replicas": 4,
                        "minReplicas": 2,
                        "processesPerNode": 2,
                        "command": ["python", "train.py"],
                        "parallelism": {"tensor": 2},
                    }
                ],
                "data": {"seqLen": 32, "microBatch": 4, "sources": [{"name": "s", "shards": ["x"]}], **data},
            },
        }
    )


def shrunk(nodes: int, **kw: object) -> tuple[Assignment, NodeAssignment]:
    entries = [
        NodeAssignment(node=f"node-{i}", node_rank=i, role="trainer", first_rank=2 * i, local_world_size=2)
        for i in range(nodes)
    ]
    assignment = Assignment(
        job="j",
        generation=2,
        world_size=2 * nodes,
        master_addr="127.0.0.1",
        master_port=29500,
        nodes=entries,
        created_at=time.time(),
        **kw,  # type: ignore[arg-type]
    )
    return assignment, entries[-1]


def test_a_shrunk_generation_keeps_the_global_batch_in_more_passes() -> None:
    assignment, mine = shrunk(2)  # 4 nodes x 2 (TP 2: DP 4) down to 2 nodes (DP 2)
    assert generation_spec(job().spec, assignment).roles[0].replicas == 2
    env = worker_env({}, job(), assignment, mine, 1, SERVICES)
    assert env[contract.WORLD_SIZE] == "4" and env[contract.DATA_PARALLEL] == "2"
    assert env[contract.TENSOR_PARALLEL] == "2"  # the other dimensions are kept
    # the declared global batch is DP 4 x 4 = 16: 8 a rank, in 2 passes of 4
    assert (env[contract.DATA_MICRO_BATCH], env[contract.DATA_ACCUMULATION]) == ("4", "2")


def test_at_full_size_or_scaling_the_batch_a_rank_takes_one_micro_batch() -> None:
    assignment, mine = shrunk(4)
    env = worker_env({}, job(), assignment, mine, 0, SERVICES)
    assert (env[contract.DATA_PARALLEL], env[contract.DATA_MICRO_BATCH], env[contract.DATA_ACCUMULATION]) == (
        "4",
        "4",
        "1",
    )
    assignment, mine = shrunk(2)
    env = worker_env({}, job(globalBatchOnResize="Scale"), assignment, mine, 0, SERVICES)
    assert (env[contract.DATA_MICRO_BATCH], env[contract.DATA_ACCUMULATION]) == ("4", "1")


def test_a_replay_group_keeps_its_own_layout() -> None:
    assignment, mine = shrunk(2, replay_steps=5)
    assert generation_spec(job().spec, assignment) == job().spec
