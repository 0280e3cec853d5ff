"""The worker contract as the launcher writes it: `worker_env()` is pure, so every variable is tested here."""

from __future__ import annotations

import time
from pathlib import Path

from stalwart import worker_contract as contract
from stalwart.agents.launcher import NodeServices, worker_env
from stalwart.agents.warm_pool import import_time_env, warm_size
from stalwart.checkpoint.memory_auth import TOKEN_ENV
from stalwart.spec import Parallelism, Role, TrainingJob
from stalwart.store.records import Assignment, NodeAssignment

SERVICES = NodeServices(
    node="node-2",
    progress_socket="/tmp/stw-x/progress.sock",
    checkpoint_uri="/ckpt",
    memory_uri="mem://127.0.0.1:9/j?peer=127.0.0.1:8",
    checkpoint_token="t0ken",
    checkpoint_request="/tmp/stw-x/checkpoint-request.json",
    shadow_segment="stalwart-j-node-2",
    data_config='{"sources": []}',
    bin_dir="/venv/bin",
)


def job(**role_env: str) -> TrainingJob:
    role = Role(
        name="trainer",
        replicas=4,
        processes_per_node=2,
        command=["python", "train.py"],
        parallelism=Parallelism(tensor=2, pipeline=2),
        env=role_env,
    )
    return TrainingJob.model_validate(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "j"},
            "spec": {
                "roles": [role.model_dump(by_alias=True)],
                "checkpoint": {"intervalSteps": 7, "keepLast": 2},
                "data": {"seqLen": 32, "microBatch": 4, "sources": [{"name": "s", "shards": ["x"]}]},
            },
        }
    )


def generation(**kw: object) -> tuple[Assignment, NodeAssignment]:
    mine = NodeAssignment(node="node-2", node_rank=2, role="trainer", first_rank=4, local_world_size=2)
    nodes = [
        NodeAssignment(node=f"node-{i}", node_rank=i, role="trainer", first_rank=2 * i, local_world_size=2)
        for i in (0, 1, 3)
    ]
    assignment = Assignment(
        job="j",
        generation=3,
        world_size=8,
        master_addr="10.0.0.1",
        master_port=29500,
        nodes=[*nodes, mine],
        created_at=time.time(),
        **kw,  # type: ignore[arg-type]
    )
    return assignment, mine


def test_a_worker_gets_torchruns_variables_the_layout_and_the_nodes_services() -> None:
    assignment, mine = generation(resume_max_step=30, code_version="v2")
    base = {"PATH": "/usr/bin", "HOME": "/root"}
    env = worker_env(base, job(), assignment, mine, 1, SERVICES, Path("/run/node-2/gen-0003"))
    assert {k: env[k] for k in contract.TORCHRUN} == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "2",
        "GROUP_WORLD_SIZE": "4",
        "ROLE_NAME": "trainer",
        "ROLE_RANK": "5",
        "ROLE_WORLD_SIZE": "8",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "j",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": str(job().spec.failure_policy.max_restarts),
        "TORCHELASTIC_ERROR_FILE": "/run/node-2/gen-0003/rank-5-error.json",
    }
    assert [env[k] for k in ("STALWART_TP", "STALWART_PP", "STALWART_CP", "STALWART_EP", "STALWART_DP")] == [
        "2",
        "2",
        "1",
        "1",
        "2",
    ]
    assert env[contract.GENERATION] == "3" and env[contract.NODE] == "node-2" and env[contract.JOB] == "j"
    assert env[contract.CHECKPOINT_URI] == "/ckpt" and env[contract.CHECKPOINT_MEMORY_URI] == SERVICES.memory_uri
    # the memory stores' token by environment, under the name the checkpoint engine reads
    assert env[contract.CHECKPOINT_TOKEN] == "t0ken" and contract.CHECKPOINT_TOKEN == TOKEN_ENV
    assert env[contract.CHECKPOINT_INTERVAL] == "7" and env[contract.CHECKPOINT_KEEP] == "2"
    assert env[contract.RESUME_MAX_STEP] == "30" and env[contract.CODE_VERSION] == "v2"
    assert env[contract.DATALOADER_SHM] == "stalwart-j-node-2" and env[contract.DATA_MICRO_BATCH] == "4"
    assert env[contract.PROGRESS_SOCKET] == SERVICES.progress_socket
    assert env[contract.CHECKPOINT_REQUEST] == SERVICES.checkpoint_request  # the controller's "checkpoint now"
    assert env["PATH"] == "/venv/bin:/usr/bin" and env["HOME"] == "/root" and env["OMP_NUM_THREADS"] == "1"
    assert contract.REPLAY_STEPS not in env


def test_the_contract_wins_over_stale_agent_variables_and_the_role_adds_its_own() -> None:
    """A role's env may not name the platform's variables (the spec refuses RANK); the agent's own
    environment may still hold stale ones, and the contract wins over them."""
    assignment, mine = generation()
    base = {"RANK": "99", contract.RESUME_MAX_STEP: "10", contract.FAULT_HOOKS: "{}", "OMP_NUM_THREADS": "4"}
    env = worker_env(base, job(MY_FLAG="1"), assignment, mine, 0, SERVICES)
    assert env["RANK"] == "4" and env["MY_FLAG"] == "1" and env["OMP_NUM_THREADS"] == "4"
    assert contract.RESUME_MAX_STEP not in env  # no rollback in this generation
    assert env[contract.FAULT_HOOKS] == "{}"  # injected faults reach the workers through the agent


def test_a_replay_group_is_a_smaller_copy_of_the_job() -> None:
    """Same TP and PP, fewer data-parallel replicas; scratch checkpoints, no memory tier, no rollback
    bound, its data read in process."""
    mine = NodeAssignment(
        node="node-2",
        node_rank=1,
        role="trainer",
        first_rank=2,
        local_world_size=2,
        group="v1",
        master_addr="127.0.0.1",
        master_port=4000,
        world_size=4,
    )
    assignment = Assignment(
        job="j",
        generation=5,
        world_size=4,
        master_addr="127.0.0.1",
        master_port=4000,
        nodes=[mine],
        created_at=0.0,
        replay_steps=8,
        resume_max_step=30,
    )
    env = worker_env({}, job(), assignment, mine, 1, SERVICES)
    assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == ("3", "4", "4000")
    assert (env["STALWART_TP"], env["STALWART_PP"], env["STALWART_DP"]) == ("2", "2", "1")
    assert env[contract.REPLAY_STEPS] == "8"
    assert env[contract.CHECKPOINT_URI] == "/ckpt-replay/gen-0005/v1"
    for absent in (
        contract.CHECKPOINT_MEMORY_URI,
        contract.CHECKPOINT_TOKEN,
        contract.RESUME_MAX_STEP,
        contract.DATALOADER_SHM,
        contract.CHECKPOINT_REQUEST,  # a replay's scratch checkpoints are not the job's to suspend on
    ):
        assert absent not in env
    assert env[contract.DATA_CONFIG] == SERVICES.data_config  # it reads the job's data itself


def test_no_fork_server_for_a_job_whose_commands_cannot_be_forked() -> None:
    relay = Role(name="relay", command=["python", "-m", "stalwart.rlhf.relay_server"])
    roles = [relay, Role(name="actor", processes_per_node=2, command=["python", "actor.py"])]
    assert warm_size(roles) == 2 and warm_size([relay]) == 0


def test_the_import_time_environment_leaves_out_what_torch_reads_only_when_it_compiles() -> None:
    """torch writes its inductor cache folder back into os.environ the first time it compiles: a
    process that compiled must not look like one started with other imports (a fork server's workers
    and a shared zygote's sessions compare these)."""
    env = {"PYTHONHASHSEED": "0", "TORCH_LOGS": "+dynamo", "TORCHINDUCTOR_CACHE_DIR": "/tmp/x", "HOME": "/root"}
    assert import_time_env(env) == {"PYTHONHASHSEED": "0", "TORCH_LOGS": "+dynamo"}


def two_roles(**spec: object) -> TrainingJob:
    roles = [
        Role(name="actor", replicas=2, processes_per_node=2, command=["python", "a.py"]),
        Role(name="rollout", replicas=3, processes_per_node=1, command=["python", "r.py"]),
    ]
    return TrainingJob.model_validate(
        {
            "apiVersion": "stalwart.dev/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": "rl"},
            "spec": {"roles": [r.model_dump(by_alias=True) for r in roles], **spec},
        }
    )


def two_role_nodes(own_worlds: bool) -> list[NodeAssignment]:
    """actor: node-0, node-1 (2 ranks each, job-wide ranks 0-3); rollout: node-2..4 (ranks 4-6)."""
    nodes = []
    for i, (role, first, procs) in enumerate(
        [("actor", 0, 2), ("actor", 2, 2)] + [("rollout", 4 + k, 1) for k in range(3)]
    ):
        node = NodeAssignment(node=f"node-{i}", node_rank=i, role=role, first_rank=first, local_world_size=procs)
        if own_worlds:
            start_node, start_rank = (0, 0) if role == "actor" else (2, 4)
            node.world_size = 4 if role == "actor" else 3
            node.role_first_rank, node.role_node_rank = first - start_rank, i - start_node
            node.master_addr, node.master_port = "127.0.0.1", 4000 if role == "actor" else 4001
        nodes.append(node)
    return nodes


def test_torchruns_role_and_group_sizes_in_a_job_of_several_roles() -> None:
    """ROLE_RANK and ROLE_WORLD_SIZE count the workers of the node's role in its world;
    GROUP_WORLD_SIZE the nodes of that world; TORCHELASTIC_MAX_RESTARTS is the job's budget."""
    job = two_roles(failurePolicy={"maxRestarts": 7})
    for own_worlds, expected in (
        # One world shared by the roles: the rollout's first worker is job rank 4, role rank 0.
        (False, {"RANK": "5", "WORLD_SIZE": "7", "GROUP_RANK": "3", "GROUP_WORLD_SIZE": "5"}),
        # Each role its own world: ranks, node ranks and sizes count within the role.
        (True, {"RANK": "1", "WORLD_SIZE": "3", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "3"}),
    ):
        nodes = two_role_nodes(own_worlds)
        assignment = Assignment(
            job="rl", generation=1, world_size=7, master_addr="127.0.0.1", master_port=3999, nodes=nodes, created_at=0.0
        )
        env = worker_env({}, job, assignment, nodes[3], 0, SERVICES)
        assert {k: env[k] for k in expected} == expected
        assert (env["ROLE_NAME"], env["ROLE_RANK"], env["ROLE_WORLD_SIZE"]) == ("rollout", "1", "3")
        assert env["TORCHELASTIC_MAX_RESTARTS"] == "7"
        actor = worker_env({}, job, assignment, nodes[1], 1, SERVICES)
        assert (actor["ROLE_RANK"], actor["ROLE_WORLD_SIZE"]) == ("3", "4")
        assert contract.ERROR_FILE not in env  # no folder given: no stale value either
