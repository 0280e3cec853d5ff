"""`stalwart status JOB`: one job's nodes, ranks and their health, progress, standbys and recent incidents."""

from __future__ import annotations

import time

from pydantic import BaseModel
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from stalwart.cli.connection import EtcdOption, open_store
from stalwart.cli.errors import cli_errors
from stalwart.cli.incidents_cmd import IncidentRow, incident_row, incidents_table
from stalwart.cli.lookup import JobArg, job_topology, require_state
from stalwart.cli.output import (
    OutputFormat,
    OutputOption,
    ago,
    duration,
    num,
    out,
    percent,
    print_json,
)
from stalwart.cli.verdict_view import rank_ranges
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
from stalwart.styles import phase_text

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
    from stalwart.controller.core.ettr import compute_ettr

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
    from stalwart.controller.detectors.throughput import job_throughput
    from stalwart.spec import SpecError
    from stalwart.store.jobs import read_spec

    if nodes is None:
        return None
    try:
        spec = read_spec(store, job)
    except SpecError:
        return None
    return job_throughput(state.current_workers(nodes.heartbeats), spec.spec if spec else None).mfu


NODE_STYLE = {
    "up": "green",
    "lost": "bold red",
    "standby": "cyan",
    "standby-starting": "yellow",
    "evicted": "red",
    "idle": "dim",
}
HEALTH_STYLE = {
    "ok": "green",
    "stalled": "bold yellow",
    "starting": "yellow",
    "crashed": "bold red",
    "done": "dim",
    "missing": "bold red",
}


def _header(r: StatusReport) -> Table:
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column(overflow="fold")
    t.add_row(
        "job",
        Text.assemble(
            (r.job, "bold cyan"),
            "  ",
            phase_text(r.phase),
            f"  generation {r.generation}  age {duration(r.age_seconds)}",
        ),
    )
    if r.reason or r.message:
        t.add_row("reason", f"{r.reason or '-'}: {r.message or ''}")
    if r.layout:
        t.add_row("layout", r.layout)
    mfu = f"  MFU {r.mfu:.1%}" if r.mfu is not None else ""
    t.add_row(
        "progress", f"step {num(r.step)}  loss {num(r.loss, '.4f')}  tokens/s {num(r.tokens_per_second, ',.0f')}{mfu}"
    )
    t.add_row("restarts", f"{r.restarts} ({r.infra_restarts} caused by the infrastructure)")
    e = r.ettr
    t.add_row(
        "ETTR",
        f"{percent(e['ettr'])}  (downtime {duration(e['downtime_seconds'])}, redone work "
        f"{duration(e['lost_work_seconds'])} over {duration(e['window_seconds'])})",
    )
    ckpt = r.last_checkpoint
    where = "+".join(ckpt.tiers) if ckpt and ckpt.tiers else "tier not reported"
    t.add_row("checkpoint", f"step {ckpt.step} ({where}) {ago(ckpt.committed_at)}" if ckpt else "none yet")
    if r.open_incident:
        t.add_row("incident", Text(f"{r.open_incident} open: stalwart incident {r.open_incident}", style="bold yellow"))
    return t


def nodes_table(rows: list[NodeRow]) -> Table:
    t = Table(title="nodes", title_justify="left", box=box.SIMPLE_HEAVY, pad_edge=False)
    for col in ("node", "state", "slot", "ranks", "host", "heartbeat", "gen", "faults"):
        t.add_column(col, no_wrap=col != "faults", overflow="fold")
    for n in rows:
        state = Text(n.state, style=NODE_STYLE.get(n.state, ""))
        if n.cordoned:
            state.append(" cordoned", style="bold magenta")
        t.add_row(
            n.node,
            state,
            num(n.node_rank),
            rank_ranges(n.ranks) if n.ranks else "-",
            n.host or "-",
            "-" if n.heartbeat_age is None else f"{duration(n.heartbeat_age)} ago",
            num(n.generation),
            Text(", ".join(n.machine_faults) or "-", style="bold red" if n.machine_faults else "dim"),
        )
    return t


def coords_text(coords: dict[str, int | str] | None, dims: tuple[str, ...]) -> str:
    """'tp1 pp0 dp1' for the dimensions the job splits."""
    return " ".join(f"{d}{coords[d]}" for d in dims) if coords else "-"


def split_dims(rows: list[RankRow]) -> tuple[str, ...]:
    """The parallel dimensions some rank has a non-zero coordinate in (none for a job that is only DP)."""
    dims = tuple(d for d in ("tp", "cp", "pp", "ep") if any(r.coords and r.coords.get(d) for r in rows))
    return (*dims, "dp") if dims else ()


def ranks_table(rows: list[RankRow]) -> Table:
    """Fits 80 columns: the exit code goes with the health, the class column only when a rank has one,
    the layout column only when the job splits the model (in plain DP it is the rank)."""
    with_class = any(r.failure_class for r in rows)
    dims = split_dims(rows)
    t = Table(title="ranks", title_justify="left", box=box.SIMPLE_HEAVY, pad_edge=False)
    for col in ("rank", "node", *(("layout",) if dims else ()), "health", "step", "loss", "step time", "last step") + (
        ("class",) if with_class else ()
    ):
        t.add_column(col, no_wrap=True, justify="right" if col in ("rank", "step", "loss", "step time") else "left")
    for r in rows:
        health = Text(r.health, style=HEALTH_STYLE.get(r.health, ""))
        if r.exit_code is not None:
            health.append(f" ({r.exit_code})")
        cells: list[str | Text] = [
            str(r.rank),
            r.node or "-",
            *([coords_text(r.coords, dims)] if dims else []),
            health,
            num(r.step),
            num(r.loss, ".4f"),
            "-" if r.step_time is None else f"{r.step_time * 1000:.0f}ms",
            "-" if r.progress_age is None else f"{duration(r.progress_age)} ago",
        ]
        t.add_row(*cells, *([r.failure_class or "-"] if with_class else []))
    return t


def status_view(r: StatusReport) -> Group:
    parts: list = [_header(r), nodes_table(r.nodes)]
    if r.detail:
        parts.append(ranks_table(r.ranks))
    else:
        parts.append(
            Text(
                f"{len(r.nodes)} nodes: more than {DETAIL_NODES}, so no heartbeat was read and ranks are not "
                "listed (stalwart diagnose JOB looks at every rank)",
                style="dim",
            )
        )
    if r.standbys:
        parts.append(Text(f"standby pool: {', '.join(r.standbys)}", style="cyan"))
    else:
        parts.append(Text("standby pool: empty", style="dim"))
    for req in r.pending_requests:
        parts.append(
            Text(
                f"pending request {req.id}: {req.kind.value} {req.node or 'all nodes'} "
                f"(by {req.requested_by or '?'}, {ago(req.requested_at)})",
                style="yellow",
            )
        )
    if r.incidents:
        title = f"recent incidents ({len(r.incidents)} of {r.incident_count})"
        parts.append(incidents_table(r.incidents, show_job=False, title=title))
    else:
        parts.append(Text("no incidents", style="dim"))
    return Group(*parts)


@cli_errors
def status(
    job: JobArg,
    etcd: EtcdOption = None,
    output: OutputOption = OutputFormat.TABLE,
) -> None:
    """Show a job: progress, nodes and their ranks, each rank's health, the standby pool, recent incidents.

    A rank is "stalled" after 5 of its step times (10 s at least) without a step: look closer with diagnose.

    Examples:

        stalwart status pretrain-tiny

        stalwart status pretrain-tiny -o json | jq '.ranks[] | select(.health != "ok")'
    """
    with open_store(etcd) as store:
        report = read_status(store, job)
    if output is OutputFormat.JSON:
        print_json(report)
        return
    out.print(status_view(report))
