"""Records that cross a process boundary: stored in etcd or sent over the agent's local socket.

Times are seconds since the epoch (time.time()), so every process agrees on them on one host and
NTP keeps them close across hosts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

from stalwart.spec.model import FailureAction, FailureEvent


class Record(BaseModel):
    model_config = ConfigDict(extra="ignore")

    def dumps(self) -> str:
        return self.model_dump_json()

    @classmethod
    def loads(cls, raw: bytes | str):  # type: ignore[no-untyped-def]
        return cls.model_validate_json(raw)


class JobPhase(str, Enum):
    """The phase users see (CLI, operator status, console): a coarse view of the job's `JobStage`."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (JobPhase.SUCCEEDED, JobPhase.FAILED)


class JobStage(str, Enum):
    """Every phase and sub-phase of the controller's state machine. Only the transition table
    (stalwart.controller.core.transitions) moves a job from one to another; `phase` is what users see."""

    STARTING = "Starting"  # Pending: the slot nodes start and register
    PREFLIGHT = "Preflight"  # Pending: pre-flight checks run on the nodes
    RUNNING = "Running"  # a generation runs
    RESTARTING = "Restarting"  # old workers stop, replacements register; then the next generation
    CHECKING = "StopTimeChecks"  # Restarting: stop-time checks on the job's nodes
    REPLAY_HORIZONTAL = "ReplayHorizontal"  # Restarting: dual-phase replay, horizontal groups
    REPLAY_VERTICAL = "ReplayVertical"  # Restarting: dual-phase replay, vertical groups
    SAVING = "SuspendSaving"  # Suspended: the workers save a checkpoint first, still running
    SUSPENDING = "Suspending"  # Suspended: workers and nodes stop, the state stays
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def phase(self) -> JobPhase:
        return _PHASES[self]

    @property
    def terminal(self) -> bool:
        return self.phase.terminal


_PHASES: dict[JobStage, JobPhase] = {
    JobStage.STARTING: JobPhase.PENDING,
    JobStage.PREFLIGHT: JobPhase.PENDING,
    JobStage.RUNNING: JobPhase.RUNNING,
    JobStage.RESTARTING: JobPhase.RESTARTING,
    JobStage.CHECKING: JobPhase.RESTARTING,
    JobStage.REPLAY_HORIZONTAL: JobPhase.RESTARTING,
    JobStage.REPLAY_VERTICAL: JobPhase.RESTARTING,
    JobStage.SAVING: JobPhase.SUSPENDED,
    JobStage.SUSPENDING: JobPhase.SUSPENDED,
    JobStage.SUSPENDED: JobPhase.SUSPENDED,
    JobStage.SUCCEEDED: JobPhase.SUCCEEDED,
    JobStage.FAILED: JobPhase.FAILED,
}


def _stage_of(data: dict[str, Any]) -> JobStage:
    """The stage of a state given only its phase: one written before stages existed (its flags
    say which sub-phase it was in), or one built by hand with `phase=`."""
    phase = JobPhase(data["phase"])
    if phase is JobPhase.RESTARTING:
        replay = data.get("replay") or {}
        if replay.get("phase") == "vertical":
            return JobStage.REPLAY_VERTICAL
        if replay:
            return JobStage.REPLAY_HORIZONTAL
        return JobStage.CHECKING if data.get("checks_pending") else JobStage.RESTARTING
    return {JobPhase.PENDING: JobStage.STARTING, JobPhase.SUSPENDED: JobStage.SUSPENDED}.get(phase) or JobStage(
        phase.value
    )


class ReplayGroupRun(BaseModel):
    """One group of a dual-phase replay: a few steps of the job on these nodes alone."""

    id: str
    nodes: list[str]
    outcome: Literal["passed", "failed"] | None = None
    reason: str = ""


class ReplayState(BaseModel):
    """A dual-phase replay: the horizontal groups, then the vertical ones (the job's stage says
    which phase runs)."""

    horizontal: list[ReplayGroupRun]
    vertical: list[ReplayGroupRun]
    generation: int | None = None  # the generation running the current phase's groups
    started_at: float | None = None
    # A multi-role job replays the failed role alone, on its own nodes and layout; the other roles
    # keep running. None: the job's only role.
    role: str | None = None

    def groups(self, stage: JobStage) -> list[ReplayGroupRun]:
        return self.vertical if stage is JobStage.REPLAY_VERTICAL else self.horizontal


class Suspension(BaseModel):
    """A time the job was suspended (spec.suspend): not training, and not the platform's fault."""

    started_at: float
    ended_at: float | None = None
    # The checkpoint asked of the workers before they stopped (CheckpointRequest): the step they were
    # to save at, and the step committed for it (None: none came within the grace period).
    save_step: int | None = None
    saved_step: int | None = None


class Resize(BaseModel):
    """A role's size changed by elastic data parallelism (spec.roles[].minReplicas): a lost node no
    machine could replace shrank it, or capacity that came back grew it."""

    role: str
    from_replicas: int
    to_replicas: int
    replicas: int  # the spec's
    capacity: float  # the job's ranks after it, over the ranks its spec declares (1.0: full size)
    at: float  # when it was decided


class RoleState(BaseModel):
    """One role of the job as its own world: its slots, its rendezvous, its own generation counter and
    its own accounting. A role-scoped restart (`restartScope: Role`) moves only this role's record;
    the job's generation still numbers every assignment written (keys.generation)."""

    name: str
    first_slot: int  # the role's nodes are slots[first_slot : first_slot + nodes]
    nodes: int
    first_rank: int  # the job-wide rank of the role's rank 0 (ranks stay unique in heartbeats)
    world_size: int
    restart_scope: Literal["Role", "Job"] = "Job"
    generation: int = 0  # the role's own counter: 1 at its first start, + 1 at each of its restarts
    assigned_in: int = 0  # the job generation whose assignment the role's nodes run
    master_addr: str | None = None  # the role's own rendezvous (its node rank 0)
    master_port: int | None = None
    generation_started_at: float | None = None
    restarts: int = 0  # counted restarts caused by this role's failures
    infra_restarts: int = 0  # uncounted ones (machine faults, lost nodes, hangs)
    restarted: int = 0  # how often the role's workers were restarted, by its own failures or the job's
    incidents: list[str] = []  # the incidents this role's failures opened
    # Role-scoped failures in a row that no check explained: at failurePolicy.replayAfter, the role
    # alone is replayed.
    unexplained_failures: int = 0


class JobState(Record):
    """What the controller must not forget about a job."""

    job: str
    stage: JobStage = JobStage.STARTING
    stage_since: float | None = None  # when the job entered its stage
    generation: int = 0
    restarts: int = 0
    # slots[i] is the node holding node rank i; a replacement inherits the lost node's slot.
    slots: list[str] = []
    next_node_index: int = 0
    # Slot nodes that died before they joined, since the job started or last began a generation.
    died_before_joining: int = 0
    preflight_rounds: int = 0
    # Warm standbys: started, checked, waiting to take a failed node's slot (and its ranks).
    standbys: list[str] = []
    # Nodes taken out of the job for a machine fault; never given a slot again.
    evicted: list[str] = []
    # Restarts caused by the infrastructure: they do not count against maxRestarts.
    infra_restarts: int = 0
    user_code_failures: int = 0
    # Standbys that passed their checks (pre-flight, or the check run when they joined).
    standbys_checked: list[str] = []
    # Failures in a row that no check explained; at failurePolicy.replayAfter, a replay starts.
    unexplained_failures: int = 0
    replay: ReplayState | None = None
    # Resume from a checkpoint no newer than this step (a rollback), until a newer one is saved.
    resume_max_step: int | None = None
    generation_started_at: float | None = None
    # The spec's codeVersion the running generation was started with, and when a newer one arrived.
    code_version: str | None = None
    code_update_seen_at: float | None = None
    open_incident: str | None = None
    suspensions: list[Suspension] = []
    reason: str | None = None
    message: str | None = None
    created_at: float
    started_at: float | None = None
    # First training step of the job: the start of the window that ETTR is measured over.
    first_step_at: float | None = None
    last_step: int | None = None
    last_loss: float | None = None
    progress_noted_at: float | None = None  # when last_step and last_loss were last copied
    # The running workers' tokens/s together, noted with the step (for listings that read no heartbeat).
    last_tokens_per_second: float | None = None
    finished_at: float | None = None
    updated_at: float
    # Multi-role jobs (RLHF): each role its own world. Empty for a state written before roles had one.
    roles: dict[str, RoleState] = {}
    # A role-scoped recovery under way: only these roles' nodes stop and start. Empty: the whole job.
    restarting_roles: list[str] = []
    # The job generation each slot node runs, once a role-scoped restart left roles on different ones.
    node_generations: dict[str, int] = {}
    # Standby -> the role whose nodes it may replace (a standby runs on its role's template).
    standby_roles: dict[str, str] = {}
    # Elastic data parallelism: every change of a role's size, oldest first (ETTR counts the time
    # below full size at the capacity it had).
    resizes: list[Resize] = []
    # The generation whose workers were asked to checkpoint early so that a shrunk role can grow.
    grow_checkpoint_generation: int | None = None

    def role_slots(self, role: str) -> list[str]:
        r = self.roles[role]
        return self.slots[r.first_slot : r.first_slot + r.nodes]

    def slot_roles(self) -> dict[str, str]:
        """Slot node -> the role whose slot it holds (a state without roles: empty). One pass over
        the slots: what loops over every node use, where `role_of` each would be quadratic (a
        10,000-node status took 4 s of it)."""
        return {node: r.name for r in self.roles.values() for node in self.role_slots(r.name)}

    def role_of(self, node: str) -> str | None:
        """The role whose slot `node` holds (None: not a slot, or a state without roles). For one
        node; a loop over many uses `slot_roles`."""
        if node not in self.slots:
            return None
        index = self.slots.index(node)
        return next((r.name for r in self.roles.values() if r.first_slot <= index < r.first_slot + r.nodes), None)

    def running_generation(self, node: str) -> int:
        """The generation whose assignment `node` runs (roles restarted alone run newer ones)."""
        return self.node_generations.get(node, self.generation)

    def current_workers(self, beats: Mapping[str, Heartbeat]) -> list[WorkerStatus]:
        """The workers the slot nodes run now, as their last heartbeats say (a heartbeat from a
        generation the node no longer runs, or not yet, says nothing about them)."""
        return [
            w
            for n in self.slots
            if (b := beats.get(n)) is not None and b.generation == self.running_generation(n)
            for w in b.workers
        ]

    def restarting_slots(self) -> list[str]:
        """The slots a recovery under way stops and starts again: its roles', or every slot."""
        if not self.restarting_roles:
            return list(self.slots)
        roles = self.slot_roles()
        return [n for n in self.slots if roles.get(n) in self.restarting_roles]

    @model_validator(mode="before")
    @classmethod
    def _stage_from_phase(cls, data: Any) -> Any:
        if isinstance(data, dict) and "stage" not in data and data.get("phase") is not None:
            return {**data, "stage": _stage_of(data)}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def phase(self) -> JobPhase:
        """Derived from the stage, and stored with it for readers of the JSON."""
        return self.stage.phase


class NodeRegistration(Record):
    node: str
    job: str
    host: str
    agent_pid: int
    registered_at: float
    lease_id: int
    metrics_port: int | None = None  # the agent's Prometheus /metrics
    address: str = "127.0.0.1"  # where the node's services (metrics, memory store) are reached
    memory_port: int | None = None  # the node's host-memory checkpoint store


class StackRequest(Record):
    """Ask every agent of a job for its workers' stacks now (written by the controller or CLI)."""

    id: str
    requested_at: float


class CheckpointRequest(Record):
    """Ask every worker of a generation to checkpoint at `step` (written by the controller before it
    suspends a job; agents hand it to their workers: worker_sdk.checkpoint_requested). A rank that
    reads it only after `step` saves at its next step."""

    id: str
    generation: int
    step: int
    reason: str
    requested_at: float


class StackReport(Record):
    request_id: str
    node: str
    generation: int
    captured_at: float
    stacks: list[dict[str, Any]]  # StackDump records, one per worker
    # The node's recent metric vectors (stalwart.health.node_vector.NodeMetricVector), oldest first.
    metrics: list[dict[str, Any]] = []


class WorkerState(str, Enum):
    RUNNING = "running"
    EXITED = "exited"


class LogMatch(Record):
    """A log-signature match in a worker's output (the scanner's SignatureMatch, flattened)."""

    failure_class: str
    scope: str
    severity: str
    line: str
    line_number: int
    matched_at: float


class WorkerStatus(Record):
    local_rank: int
    rank: int
    pid: int
    state: WorkerState
    exit_code: int | None = None
    started_at: float
    exited_at: float | None = None
    step: int | None = None
    loss: float | None = None
    tokens_per_second: float | None = None
    flops_per_second: float | None = None  # the model FLOPs the script said a step does, over its step time
    step_time: float | None = None
    last_progress_at: float | None = None
    # First step this worker reported: tells a resumed run from a reset one.
    first_step: int | None = None
    first_step_at: float | None = None
    first_loss: float | None = None
    last_checkpoint_step: int | None = None
    # The data loader's state delta at that checkpoint (position, fingerprint): a standby that takes
    # this rank's place pre-warms its shadow loader from it.
    last_checkpoint_data: dict[str, Any] | None = None
    phases: PhaseTimes | None = None  # the last step's, as the SDK reported them
    # The highest loss of the steps reported in the last few heartbeat intervals, and its step: a
    # one-step spike in a job that steps faster than it beats is still in the beat after it.
    peak_loss: float | None = None
    peak_loss_step: int | None = None
    log_tail: list[str] = []
    # What the agent's streaming scan of this worker's output found (the most recent, bounded).
    matches: list[LogMatch] = []
    # The verdict on an exit: failure class, blame scope (node, job, user_code) and why.
    failure_class: str | None = None
    blame_scope: str | None = None
    failure_reason: str | None = None


class SavedCheckpoint(Record):
    """A committed checkpoint as a node's ranks reported it: the agent merges its ranks' reports, the
    controller merges the nodes' into the job's catalog (stalwart.controller.core.catalog)."""

    step: int
    generation: int | None = None  # the saving workers' generation: a later one's save of a step replaces it
    committed_at: float
    tiers: list[str] = []
    total_bytes: int | None = None  # every rank's bytes, when the coordinating rank is on this node
    location: str | None = None


class Heartbeat(Record):
    node: str
    generation: int
    sent_at: float
    workers: list[WorkerStatus] = []
    # The compact per-node metric vector for metric-based diagnosis (stalwart.health NodeMetricVector).
    vector: dict[str, Any] | None = None
    # Machine faults the probes found (Xid 79, uncorrectable ECC, NIC down, disk full...): evict now.
    machine_faults: list[str] = []
    # The agent's named state (stalwart.agents.supervisor.AgentState): standby, idle, running...
    agent_state: str | None = None
    # The newest checkpoints the node's ranks reported committed, newest first (bounded).
    checkpoints: list[SavedCheckpoint] = []


class NodeAssignment(Record):
    node: str
    node_rank: int
    role: str
    first_rank: int
    local_world_size: int
    # A replay group's or a role's own rendezvous (ranks then count from its first node).
    group: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    world_size: int | None = None
    # A role that is its own world (multi-role jobs): its workers' RANK and GROUP_RANK count from 0
    # within the role, and its generation is the role's own. `first_rank` stays job-wide: heartbeats,
    # stacks and incidents name a rank the whole job agrees on.
    role_first_rank: int | None = None
    role_node_rank: int | None = None
    role_generation: int | None = None
    # The node's host-memory checkpoint store ("address:port", from its registration), so that an
    # agent finds its peers' stores in the assignment it reads anyway, not in every registration.
    memory: str | None = None


# In etcd an assignment is stored as runs of consecutive nodes: within a run, node i's node rank
# and role node rank are the run's plus i, its first ranks the run's plus i x local_world_size, and
# every other field is the run's. A job's slots are in order, so a job of N nodes is one run per
# role (per replay group): 10,000 nodes x 8 ranks are ~0.3 MB (names and memory stores), where a
# record per node was 1.7 MB, over etcd's 1.5 MiB request limit.
_STEP_BY_ONE = ("node_rank", "role_node_rank")
_STEP_BY_WORLD = ("first_rank", "role_first_rank")
_PER_NODE = ("node", "memory")


def _assignment_runs(nodes: list[NodeAssignment]) -> list[dict[str, Any]]:
    shared = [f for f in NodeAssignment.model_fields if f not in _PER_NODE]
    runs: list[dict[str, Any]] = []
    expected: dict[str, Any] | None = None  # the fields the next node has if it continues the run
    for n in nodes:
        fields = {f: v for f in shared if (v := getattr(n, f)) is not None}  # a plain read: 10,000 nodes
        if fields == expected:
            runs[-1]["nodes"].append(n.node)
            runs[-1]["memory"].append(n.memory)
        else:
            runs.append({**fields, "nodes": [n.node], "memory": [n.memory]})
        expected = dict(fields)
        for name in _STEP_BY_ONE:
            if name in expected:
                expected[name] += 1
        for name in _STEP_BY_WORLD:
            if name in expected:
                expected[name] += n.local_world_size
    for run in runs:
        if not any(run["memory"]):
            del run["memory"]
    return runs


def _expand_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = []
    for run in runs:
        names, memory = run["nodes"], run.get("memory") or [None] * len(run["nodes"])
        if len(memory) != len(names):
            raise ValueError("an assignment run's memory list is not as long as its nodes")
        base = {k: v for k, v in run.items() if k not in ("nodes", "memory")}
        width = int(base["local_world_size"])
        for i, (name, store) in enumerate(zip(names, memory, strict=True)):
            entry = dict(base, node=name, memory=store)
            for key in _STEP_BY_ONE:
                if key in base:
                    entry[key] = base[key] + i
            for key in _STEP_BY_WORLD:
                if key in base:
                    entry[key] = base[key] + i * width
            nodes.append(entry)
    return nodes


class Assignment(Record):
    """Ranks and rendezvous of one generation: every worker of the generation agrees on these.
    Stored compactly (`dumps`: runs of consecutive nodes); `loads` reads both forms."""

    job: str
    generation: int
    world_size: int
    master_addr: str
    master_port: int
    nodes: list[NodeAssignment]
    created_at: float
    resume_max_step: int | None = None  # rollback: load no checkpoint newer than this
    code_version: str | None = None
    replay_steps: int | None = None  # a replay generation: each worker stops after this many steps

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        if isinstance(data, dict) and "runs" in data and "nodes" not in data:
            data = {k: v for k, v in data.items() if k != "runs"} | {"nodes": _expand_runs(data["runs"])}
        return data

    def dumps(self) -> str:
        document = self.model_dump(mode="json", exclude={"nodes"})
        document["runs"] = _assignment_runs(self.nodes)
        return json.dumps(document, separators=(",", ":"))

    def for_node(self, node: str) -> NodeAssignment | None:
        return next((n for n in self.nodes if n.node == node), None)

    def rank_nodes(self) -> dict[int, str]:
        """Global rank -> the node that runs it."""
        return {n.first_rank + i: n.node for n in self.nodes for i in range(n.local_world_size)}

    def memory_stores(self) -> dict[str, str]:
        """Node -> its host-memory checkpoint store ("address:port"), for the nodes that have one."""
        return {n.node: n.memory for n in self.nodes if n.memory}


class AgentAction(str, Enum):
    RUN = "run"  # (re)start workers for the command's generation
    STOP = "stop"  # stop workers, keep the agent
    SHUTDOWN = "shutdown"  # stop workers and exit: the job is over


class AgentCommand(Record):
    generation: int
    action: AgentAction
    issued_at: float


# An incident's class is the failure-policy event that it triggered: one vocabulary for both.
FailureClass = FailureEvent


class Incident(Record):
    """One failure, from the moment it happened to the first step after recovery."""

    id: str
    job: str
    failure_class: FailureClass
    generation: int
    node: str | None = None
    rank: int | None = None
    exit_code: int | None = None
    evidence: list[str] = []
    action: str = "restart"
    # The rung of the ladder that was taken, the nodes it evicted and who replaced them.
    policy_action: FailureAction | None = None
    suspects: list[str] = []
    evicted: list[str] = []
    replacements: dict[str, str] = {}
    counted: bool = True  # against maxRestarts; infrastructure failures are not
    role: str | None = None  # the role that failed (multi-role jobs)
    scope: Literal["Role", "Job"] = "Job"  # what restarted: that role alone, or the whole job
    resize: Resize | None = None  # the role's size changed in this recovery (elastic data parallelism)
    # Role scope: the first step the roles that kept running made after the failure (an actor that
    # trains on with what the relay holds): the job's own downtime may end before the role is back.
    job_resumed_at: float | None = None
    # The diagnosis service's verdict (stalwart.diagnosis.models.Verdict), when it was asked.
    verdict: dict[str, Any] | None = None
    runbook: str | None = None  # runbooks/<runbook>.md
    failed_at: float
    detected_at: float
    diagnosed_at: float | None = None
    restarted_at: float | None = None
    first_step_at: float | None = None
    step_at_failure: int | None = None
    loss_before: float | None = None
    resumed_step: int | None = None
    loss_after: float | None = None
    mean_step_time: float | None = None

    @property
    def recovered(self) -> bool:
        return self.first_step_at is not None

    @property
    def downtime(self) -> float | None:
        """Wall time from the failure to the first step after it: no training happened then. (Role
        scope: the first step of the roles that kept running, if it came before the role was back.)"""
        ends = [t for t in (self.first_step_at, self.job_resumed_at) if t is not None]
        return None if self.first_step_at is None else min(ends) - self.failed_at

    @property
    def recovery(self) -> float | None:
        """Wall time from the failure to the failed role's (the job's) first step after its restart."""
        return None if self.first_step_at is None else self.first_step_at - self.failed_at

    @property
    def lost_work_seconds(self) -> float:
        """Time spent recomputing steps done before the failure but after the restored checkpoint."""
        if None in (self.step_at_failure, self.resumed_step, self.mean_step_time):
            return 0.0
        redone = max(0, self.step_at_failure - self.resumed_step + 1)  # type: ignore[operator]
        return redone * self.mean_step_time  # type: ignore[operator]


class DataPlaneHealth(Record):
    """What the RLHF relay tells the controller (stalwart.rlhf.relay_server writes it every few
    seconds): workers ("role-rank") whose lease expired while they held groups, and when. Rollout,
    reward and reference workers do not step, so a hang among them shows here, not in progress."""

    incarnation: str  # the relay process that wrote it
    written_at: float
    expired_at: dict[str, float] = {}


class CheckpointTiming(BaseModel):
    """What the checkpoint engine said about one save or load (its SaveResult, its load time), as a
    worker reports it: the agent exports it; the engine itself knows nothing of the control plane."""

    operation: Literal["save", "load"] = "save"
    committed: bool = True
    stall_seconds: float | None = None  # save: how long training waited
    seconds: float | None = None  # save: from the call to the commit; load: the whole load
    bytes_written: int | None = None  # save: this rank's bytes, over every tier
    tiers: list[str] = []  # save: the tiers written; load: the tier read
    total_bytes: int | None = None  # save: every rank's bytes (the coordinator's report; 0 or None elsewhere)
    location: str | None = None  # save: the step's folder on the most durable tier (no credentials)


class PhaseTimes(BaseModel):
    """One step of one rank, split by where its time went (seconds; None: not measured)."""

    data: float | None = None  # waiting for the next batch
    compute: float | None = None  # forward and backward
    optimizer: float | None = None  # the optimizer step
    comm: float | None = None  # blocked in communication outside forward and backward
    other: float | None = None  # the step's wall time that no phase accounts for
    saving: bool = False  # a checkpoint save started since the step before (its staging is in `other`)
    # Of data, optimizer and other: the seconds the rank was ready to run but waited for a CPU that
    # another process held (Linux scheduler statistics; None where the kernel does not say).
    cpu_wait: dict[str, float] | None = None


class ProgressReport(Record):
    """Sent by the worker SDK to its agent over the local socket, once per step or event."""

    kind: Literal["step", "checkpoint"] = "step"
    rank: int
    local_rank: int
    step: int
    loss: float | None = None
    tokens: int | None = None
    flops: float | None = None  # the model FLOPs this rank did in the step (for MFU), when the script knows
    step_time: float | None = None
    sent_at: float = Field(default=0.0)
    # The sender's generation: a report the old workers sent just before they were stopped must
    # not count as the new generation's progress (same ranks, same socket).
    generation: int | None = None
    checkpoint: CheckpointTiming | None = None  # kind "checkpoint": the engine's timings, when given
    # Where the step's time went (seconds; None: not measured): waiting for data, forward and
    # backward, the optimizer step, blocked in communication, and the rest of the step's wall time.
    phases: PhaseTimes | None = None
    # With a checkpoint: the data loader's state delta at that step (position, fingerprint).
    data_state: dict[str, Any] | None = None


class LogRequest(Record):
    """Ask every agent of a job for its workers' recent output (written by the CLI)."""

    id: str
    rank: int | None = None  # None: every rank
    lines: int = Field(default=100, ge=1, le=10_000)
    requested_at: float


class WorkerLog(Record):
    rank: int
    local_rank: int
    lines: list[str]


class LogReport(Record):
    request_id: str
    node: str
    generation: int
    workers: list[WorkerLog]


class RequestKind(str, Enum):
    EVICT = "evict"  # evict the node now and hot-swap a standby in
    CORDON = "cordon"  # keep the machine out of the job's future slots and standbys
    UNCORDON = "uncordon"
    CHECK = "check"  # run the collective and compute checks on the node (or every node) now


class RequestStatus(str, Enum):
    PENDING = "Pending"
    DONE = "Done"
    FAILED = "Failed"


class OperatorRequest(Record):
    """An action asked of the controller by a person (CLI) or the Kubernetes operator."""

    id: str
    kind: RequestKind
    node: str | None = None  # None with CHECK: every node of the job
    reason: str = ""
    requested_by: str = ""
    requested_at: float
    status: RequestStatus = RequestStatus.PENDING
    message: str | None = None
    finished_at: float | None = None
    result: dict[str, Any] | None = None


class AuditEntry(Record):
    """An action a person took from the web console: kept with the job, shown on its page.

    Node actions are carried out by the controller through `request_id` (an OperatorRequest, whose
    record holds the outcome); suspend and resume change the job's spec and are done when written."""

    id: str
    job: str
    action: str  # evict, cordon, uncordon, check, suspend, resume
    node: str | None = None
    reason: str
    actor: str  # the person, as the proxy or the token named them
    via: str  # how they were identified: proxy, token, session or anonymous
    at: float
    request_id: str | None = None


class Cordon(Record):
    node: str
    reason: str
    incident: str | None = None
    cordoned_at: float
    by: str = "controller"


class CheckpointEntry(Record):
    """One committed checkpoint in the job's catalog (written by the controller alone)."""

    step: int
    uri: str  # the step's folder on its most durable tier, without credentials
    committed_at: float
    tiers: list[str] = []  # the engine's tier names: memory, file, s3
    bytes: int | None = None  # every rank's, as the coordinating rank reported (None: not reported)
    generation: int | None = None  # the generation that saved it


class ServiceEndpoint(Record):
    name: str
    url: str
    registered_at: float
