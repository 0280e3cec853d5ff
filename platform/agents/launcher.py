"""The worker launcher: one generation's workers on this node, from the controller's assignment.

`worker_env` is a pure function of what the node knows (the job, its assignment, this node's
services): the whole worker contract (stalwart.worker_contract) in one place, tested without
starting anything. `WorkerLauncher` starts the workers with it, warm when it can.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stalwart import worker_contract as contract
from stalwart.agents.warm_pool import WarmPool
from stalwart.agents.workers import WorkerGroup
from stalwart.rlhf.contract import dataplane_env
from stalwart.spec import PathConfinement, Role, TrainingJob, TrainingJobSpec
from stalwart.spec.elastic import rank_batch, resized
from stalwart.store.records import Assignment, NodeAssignment


@dataclass(frozen=True)
class NodeServices:
    """What this node offers its workers, beside the job's spec."""

    node: str
    progress_socket: str  # the agent's progress inbox
    checkpoint_uri: str  # the job's checkpoint location, made absolute
    memory_uri: str | None = None  # this node's memory store, its peer and the others (mem://...)
    checkpoint_token: str | None = None  # what the memory stores ask of their callers
    checkpoint_request: str | None = None  # the file the agent writes the controller's CheckpointRequest to
    shadow_segment: str | None = None  # the node's shadow data loader
    data_config: str | None = None  # the loader's DataConfig as JSON (with absolute shard paths)
    etcd: str | None = None  # HOST:PORT of the job's etcd (RLHF roles find the data plane there)
    address: str = "127.0.0.1"  # where this node's servers listen and are reached
    dataplane_token: str = ""  # the job's data-plane token (RLHF roles)
    bin_dir: str = str(Path(sys.executable).parent)  # workers find `python` and our tools here


def replay_scratch_uri(checkpoint_uri: str, generation: int, group: str) -> str:
    """Beside the job's checkpoints, never among them: `<uri>-replay/gen-N/<group>` (query kept)."""
    base, sep, query = checkpoint_uri.partition("?")
    return f"{base.rstrip('/')}-replay/gen-{generation:04d}/{group}{sep}{query}"


def _world_rank(node: NodeAssignment) -> int:
    """The first rank of a node's workers within their world."""
    return node.first_rank if node.role_first_rank is None else node.role_first_rank


def _world_peers(assignment: Assignment, node: NodeAssignment) -> list[NodeAssignment]:
    """The nodes of the node's world: its role's (a role that is its own world), its replay
    group's, or the job's shared world."""
    if node.role_first_rank is not None:
        return [n for n in assignment.nodes if n.role == node.role and n.role_first_rank is not None]
    return [n for n in assignment.nodes if n.group == node.group and n.role_first_rank is None]


def torchrun_env(assignment: Assignment, node: NodeAssignment, local_rank: int) -> dict[str, str]:
    """The environment torchrun gives a worker, so an unmodified torchrun-style script runs. A role
    that is its own world (multi-role jobs) counts ranks, node ranks and restarts within the role.
    torchrun's role is the workers' role within their world: ROLE_RANK and ROLE_WORLD_SIZE count the
    workers of the node's role there (all of them, in a job of one role)."""
    first = _world_rank(node)
    generation = assignment.generation if node.role_generation is None else node.role_generation
    peers = _world_peers(assignment, node)
    role_peers = [n for n in peers if n.role == node.role]
    return {
        contract.RANK: str(first + local_rank),
        contract.LOCAL_RANK: str(local_rank),
        contract.WORLD_SIZE: str(node.world_size or assignment.world_size),
        contract.LOCAL_WORLD_SIZE: str(node.local_world_size),
        contract.GROUP_RANK: str(node.node_rank if node.role_node_rank is None else node.role_node_rank),
        contract.GROUP_WORLD_SIZE: str(len(peers)),
        contract.ROLE_NAME: node.role,
        contract.ROLE_RANK: str(first + local_rank - min(_world_rank(n) for n in role_peers)),
        contract.ROLE_WORLD_SIZE: str(sum(n.local_world_size for n in role_peers)),
        contract.MASTER_ADDR: node.master_addr or assignment.master_addr,
        contract.MASTER_PORT: str(node.master_port or assignment.master_port),
        contract.RUN_ID: assignment.job,
        contract.RESTART_COUNT: str(max(0, generation - 1)),
    }


def generation_spec(spec: TrainingJobSpec, assignment: Assignment) -> TrainingJobSpec:
    """The spec at the generation's size: a role that elastic data parallelism shrank runs on the
    nodes its assignment names (a replay's groups have their own layout: the spec as declared)."""
    if assignment.replay_steps is not None:
        return spec
    return resized(spec, Counter(n.role for n in assignment.nodes))


def layout_env(role: Role, node: NodeAssignment) -> dict[str, str]:
    """The role's parallel sizes; a replay group is a smaller copy of the role (fewer DP replicas)."""
    world = node.world_size if node.group is not None and node.world_size else role.world_size
    p = role.parallelism
    return {
        contract.TENSOR_PARALLEL: str(p.tensor),
        contract.PIPELINE_PARALLEL: str(p.pipeline),
        contract.CONTEXT_PARALLEL: str(p.context),
        contract.EXPERT_PARALLEL: str(p.expert),
        contract.DATA_PARALLEL: str(p.data_parallel(world)),
    }


def worker_env(
    base: Mapping[str, str],
    job: TrainingJob,
    assignment: Assignment,
    node: NodeAssignment,
    local_rank: int,
    services: NodeServices,
    log_dir: Path | None = None,
) -> dict[str, str]:
    """Everything one worker of the generation sees: the agent's own environment (`base`), the role's
    env, then the contract's variables, which no user setting may override.

    A replay generation trains from scratch at its group's size: its checkpoints go to a scratch
    folder, never over the job's, it has no memory tier and no rollback bound, and it reads its
    data in process (the shadow loader serves the job's layout, not the group's). `log_dir`: the
    generation's folder, where TORCHELASTIC_ERROR_FILE points (beside the rank's log).
    """
    spec = generation_spec(job.spec, assignment)
    role = next(r for r in spec.roles if r.name == node.role)
    replay = assignment.replay_steps is not None
    env = {**base, **role.env}
    env["PATH"] = os.pathsep.join([services.bin_dir, base.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    for name in (*contract.STALWART, contract.ERROR_FILE):
        if name != contract.FAULT_HOOKS:  # injected faults reach workers through the agent's environment
            env.pop(name, None)
    env.update(
        {
            contract.JOB: assignment.job,
            contract.NODE: services.node,
            contract.GENERATION: str(assignment.generation),
            contract.PROGRESS_SOCKET: services.progress_socket,
            contract.CHECKPOINT_URI: services.checkpoint_uri,
            contract.CHECKPOINT_INTERVAL: str(spec.checkpoint.interval_steps),
            contract.CHECKPOINT_KEEP: str(spec.checkpoint.keep_last),
            **layout_env(role, node),
            **torchrun_env(assignment, node, local_rank),
            contract.MAX_RESTARTS: str(spec.failure_policy.max_restarts),
        }
    )
    if log_dir is not None:  # beside the rank's log (gen-NNNN/rank-R.log), for torchelastic's @record
        env[contract.ERROR_FILE] = str(log_dir / f"rank-{node.first_rank + local_rank}-error.json")
    if assignment.code_version is not None:
        env[contract.CODE_VERSION] = assignment.code_version
    if replay:
        env[contract.REPLAY_STEPS] = str(assignment.replay_steps)
        env[contract.CHECKPOINT_URI] = replay_scratch_uri(
            services.checkpoint_uri, assignment.generation, node.group or services.node
        )
    else:
        if services.memory_uri:
            env[contract.CHECKPOINT_MEMORY_URI] = services.memory_uri
            if services.checkpoint_token:
                env[contract.CHECKPOINT_TOKEN] = services.checkpoint_token
        if assignment.resume_max_step is not None:
            env[contract.RESUME_MAX_STEP] = str(assignment.resume_max_step)
        if services.checkpoint_request is not None:
            env[contract.CHECKPOINT_REQUEST] = services.checkpoint_request
        if services.shadow_segment:
            env[contract.DATALOADER_SHM] = services.shadow_segment
    if node.role_generation is not None:
        env[contract.ROLE_GENERATION] = str(node.role_generation)
    if spec.data_plane is not None:
        env[contract.NODE_ADDRESS] = services.address
        env.update(dataplane_env(assignment.job, services.etcd or "", spec.data_plane, services.dataplane_token))
    if services.data_config is not None and spec.data is not None:
        env[contract.DATA_CONFIG] = services.data_config
        declared = next(r for r in job.spec.roles if r.name == node.role)
        micro, accumulation = (
            (spec.data.micro_batch, 1) if replay else rank_batch(job.spec, declared, role.data_parallel)
        )
        env[contract.DATA_MICRO_BATCH] = str(micro)
        env[contract.DATA_ACCUMULATION] = str(accumulation)
    return env


class WorkerLauncher:
    """Starts a generation's workers (warm when a warm worker is ready and the command allows)."""

    def __init__(self, job: TrainingJob, paths: PathConfinement, run_dir: Path, warm: WarmPool) -> None:
        self.job = job
        self.paths = paths  # where the spec may point the workers (docs/security.md)
        self.run_dir = run_dir  # the node's own folder: gen-NNNN/rank-R.log
        self.warm = warm

    def working_dir(self, role: Role) -> Path:
        """The role's working directory, confined to the job's folders (ConfinementError if not)."""
        return self.paths.working_dir(role)

    def launch(self, assignment: Assignment, node: NodeAssignment, services: NodeServices) -> WorkerGroup:
        role = next(r for r in self.job.spec.roles if r.name == node.role)
        base = dict(os.environ)
        log_dir = self.run_dir / f"gen-{assignment.generation:04d}"
        envs = [
            worker_env(base, self.job, assignment, node, local_rank, services, log_dir)
            for local_rank in range(node.local_world_size)
        ]
        return WorkerGroup(
            assignment,
            node,
            role.command,
            envs,
            self.working_dir(role),
            log_dir,
            launcher=self.warm.launch,
            heartbeat_interval=self.job.spec.fault_tolerance.heartbeat_interval_seconds,
        )
