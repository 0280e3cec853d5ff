"""One job's status: its nodes, ranks and their health, progress, standbys and recent incidents
(`stalwart status`, the console's job page)."""

from __future__ import annotations

import time

from pydantic import BaseModel

from stalwart.controller.core.ettr import compute_ettr
from stalwart.ops.incidents import IncidentRow, incident_row
from stalwart.ops.lookup import job_topology, require_state
from stalwart.spec.topology import Topology
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.jobs import registered_nodes
from stalwart.store.nodes import NodeRecords, read_nodes
from stalwart.store.records import (
    Assignment,
    CheckpointEntry,
    Cordon,
    Heartbeat,
    Incident,
    JobPhase,
    JobState,
    OperatorRequest,
    RequestStatus,
    WorkerState,
    WorkerStatus,
)

# A rank is "stalled" on screen when it has not stepped for this many of its step times (and at
# least STALL_FLOOR seconds). Only a hint for people: the controller's hang timeout decides.
STALL_FACTOR = 5.0
STALL_FLOOR = 10.0
RECENT_INCIDENTS = 5
# Up to this many nodes, status reads every node's heartbeat and shows every rank. A bigger job is
# shown from its state and a keys-only listing of its nodes (up or lost; no heartbeat is read):
# 10,000 nodes' heartbeats are tens of MB, and 80,000 rank rows help nobody on a terminal.
DETAIL_NODES = 256


class NodeRow(BaseModel):
    node: str
    state: str  # up, lost, standby, standby-starting, evicted, idle
    node_rank: int | None
    role: str | None
    ranks: list[int]
    host: str | None
    heartbeat_age: float | None
    generation: int | None
    machine_faults: list[str]
    cordoned: str | None


class RankRow(BaseModel):
    rank: int
    node: str | None
    # The rank's place in its role's parallel layout: role, tp, cp, dp, pp, ep (from the job's spec).
    coords: dict[str, int | str] | None = None
    health: str  # ok, stalled, starting, crashed, done, missing
    pid: int | None
    step: int | None
    loss: float | None
    step_time: float | None
    tokens_per_second: float | None
    progress_age: float | None
    exit_code: int | None
    failure_class: str | None
    last_checkpoint_step: int | None


class StatusReport(BaseModel):
    job: str
    phase: JobPhase
    generation: int
    restarts: int
    infra_restarts: int
    reason: str | None
    message: str | None
    step: int | None
    loss: float | None
    tokens_per_second: float | None
    mfu: float | None = None  # model FLOPs utilization, where the script reports flops and the roles their peak
    ettr: dict[str, float | None]  # stalwart.controller.core.ettr.EttrReport, as JSON (keeps the import lazy)
    age_seconds: float
    layout: str | None = None  # "trainer: tp 2 x pp 2 x dp 2"
    open_incident: str | None
    nodes: list[NodeRow]
    ranks: list[RankRow]
    standbys: list[str]
    incidents: list[IncidentRow]
    incident_count: int
    last_checkpoint: CheckpointEntry | None
    pending_requests: list[OperatorRequest]
    # False for a job of more than DETAIL_NODES nodes: nodes carry no heartbeat, ranks are not listed.
    detail: bool = True
    # What this report leaves out, and where it is (a report read through the Kubernetes API, from the
    # TrainingJob's status: stalwart_operator.cli_reads); None: read from etcd.
    partial: str | None = None


def rank_health(w: WorkerStatus, now: float) -> str:
    if w.state is WorkerState.EXITED or w.exit_code is not None:
        return "done" if w.exit_code == 0 else "crashed"
    if w.last_progress_at is None:
        return "starting"
    limit = max(STALL_FLOOR, STALL_FACTOR * (w.step_time or 0.0))
    return "stalled" if now - w.last_progress_at > limit else "ok"


def node_records(store: Store, state: JobState) -> NodeRecords | None:
    """Every record of the job's nodes, heartbeats included, for a job of up to DETAIL_NODES
    nodes; None for a bigger one (whose listings read keys only)."""
    return read_nodes(store, state.job) if len(state.slots) + len(state.standbys) <= DETAIL_NODES else None


def node_rows(
    store: Store, state: JobState, assignment: Assignment | None, now: float, nodes: NodeRecords | None
) -> list[NodeRow]:
    """With `nodes` (every record of a small job's nodes), each node's heartbeat too; without, a
    keys-only listing tells which are registered."""
    registered = set(nodes.registrations) if nodes is not None else registered_nodes(store, state.job)
    nodes = nodes or NodeRecords()
    cordons = {c.node: c for c in store.get_prefix(keys.cordons_prefix(), Cordon)}
    placed = {n.node: n for n in assignment.nodes} if assignment else {}
    names = list(dict.fromkeys(state.slots + state.standbys + state.evicted + sorted(registered)))
    rows = []
    for name in names:
        reg, beat, where = nodes.registrations.get(name), nodes.heartbeats.get(name), placed.get(name)
        up = name in registered
        if name in state.evicted:
            status = "evicted"
        elif name in state.standbys:
            status = "standby" if up else "standby-starting"
        elif name in state.slots:
            status = "up" if up else "lost"
        else:
            status = "idle"
        cordon = cordons.get(name)
        rows.append(
            NodeRow(
                node=name,
                state=status,
                node_rank=state.slots.index(name) if name in state.slots else None,
                role=where.role if where else None,
                ranks=list(range(where.first_rank, where.first_rank + where.local_world_size)) if where else [],
                host=reg.host if reg else None,
                heartbeat_age=now - beat.sent_at if beat else None,
                generation=beat.generation if beat else None,
                machine_faults=beat.machine_faults if beat else [],
                cordoned=cordon.reason if cordon else None,
            )
        )
    return rows


def _coords(topology: Topology | None, rank: int) -> dict[str, int | str] | None:
    if topology is None or not 0 <= rank < topology.world_size:
        return None
    return dict(topology.coords(rank)._asdict())


def _rank_rows(
    beats: dict[str, Heartbeat], state: JobState, assignment: Assignment | None, now: float, topology: Topology | None
) -> list[RankRow]:
    owner = assignment.rank_nodes() if assignment else {}
    seen: dict[int, RankRow] = {}
    for node, beat in beats.items():
        if beat.generation != state.generation:
            continue
        for w in beat.workers:
            seen[w.rank] = RankRow(
                rank=w.rank,
                node=node,
                coords=_coords(topology, w.rank),
                health=rank_health(w, now),
                pid=w.pid,
                step=w.step,
                loss=w.loss,
                step_time=w.step_time,
                tokens_per_second=w.tokens_per_second,
                progress_age=None if w.last_progress_at is None else now - w.last_progress_at,
                exit_code=w.exit_code,
                failure_class=w.failure_class,
                last_checkpoint_step=w.last_checkpoint_step,
            )
    for rank, node in owner.items():
        if rank not in seen:
            seen[rank] = RankRow(
                rank=rank,
                node=node,
                coords=_coords(topology, rank),
                health="missing",
                pid=None,
                step=None,
                loss=None,
                step_time=None,
                tokens_per_second=None,
                progress_age=None,
                exit_code=None,
                failure_class=None,
                last_checkpoint_step=None,
            )
    return [seen[r] for r in sorted(seen)]


def read_status(store: Store, job: str) -> StatusReport:
    """One job's nodes, ranks and their health, progress, standbys and recent incidents."""
    now = time.time()
    state = require_state(store, job)
    assignment = store.get(keys.generation(job, state.generation), Assignment) if state.generation else None
    topology = job_topology(store, job, assignment)
    if topology is not None and assignment is not None and topology.world_size != assignment.world_size:
        topology = None  # a replay generation: its groups are smaller copies of the job
    nodes = node_records(store, state)
    ranks = _rank_rows(nodes.heartbeats, state, assignment, now, topology) if nodes is not None else []
    incidents = sorted(store.get_prefix(keys.incidents_prefix(job), Incident), key=lambda i: i.failed_at)
    checkpoints = store.get_prefix(keys.checkpoints_prefix(job), CheckpointEntry)
    requests = store.get_prefix(keys.requests_prefix(job), OperatorRequest)
    steps = [r.step for r in ranks if r.step is not None]
    tps = [r.tokens_per_second for r in ranks if r.tokens_per_second and r.health in ("ok", "stalled")]
    rank0 = next((r for r in ranks if r.rank == 0 and r.loss is not None), None)
    return StatusReport(
        job=job,
        phase=state.phase,
        generation=state.generation,
        restarts=state.restarts,
        infra_restarts=state.infra_restarts,
        reason=state.reason,
        message=state.message,
        step=max(steps) if steps else state.last_step,
        loss=rank0.loss if rank0 else state.last_loss,
        tokens_per_second=sum(tps) if tps else None,
        mfu=_mfu(store, job, state, nodes),
        ettr=compute_ettr(state, incidents, now).model_dump(),
        age_seconds=now - state.created_at,
        layout=topology.describe() if topology is not None else None,
        open_incident=state.open_incident,
        nodes=node_rows(store, state, assignment, now, nodes),
        ranks=ranks,
        standbys=state.standbys,
        incidents=[incident_row(i) for i in incidents[-RECENT_INCIDENTS:]],
        incident_count=len(incidents),
        last_checkpoint=max(checkpoints, key=lambda c: c.step) if checkpoints else None,
        pending_requests=[r for r in requests if r.status is RequestStatus.PENDING],
        detail=nodes is not None,
    )


def _mfu(store: Store, job: str, state: JobState, nodes: NodeRecords | None) -> float | None:
    from stalwart.controller.core.detectors.throughput import job_throughput
    from stalwart.spec import SpecError
    from stalwart.store.jobs import read_spec

    if nodes is None:
        return None
    try:
        spec = read_spec(store, job)
    except SpecError:
        return None
    return job_throughput(state.current_workers(nodes.heartbeats), spec.spec if spec else None).mfu
