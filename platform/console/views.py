"""What each page shows, read from etcd through the operations layer's readers, the CLI's too (one
reader per idea: the console adds only what a page needs beyond the terminal: the timeline, the rank
grid, the audit trail)."""

from __future__ import annotations

import statistics
import time
from typing import cast

from pydantic import BaseModel

from stalwart.ops.jobs import JobRow, read_jobs
from stalwart.ops.lookup import job_namespace, job_topology, require_state, spec_document
from stalwart.ops.status import NodeRow, RankRow, StatusReport, read_status
from stalwart.spec.topology import GroupKind, RoleLayout, Topology
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import (
    Assignment,
    AuditEntry,
    CheckpointEntry,
    Incident,
    JobPhase,
    JobStage,
    JobState,
    OperatorRequest,
    RequestKind,
)

# A rank is a straggler on screen when it is behind the front and has not stepped for this many of
# the job's median step times: a hint for people (the controller's slowdown rounds decide).
STRAGGLER_STEP_TIMES = 3.0
STRAGGLER_FLOOR_SECONDS = 2.0
# The order a rank's groups are named in on its cell; cp and ep only where the layout uses them.
SHOWN_KINDS: tuple[GroupKind, ...] = ("tp", "cp", "pp", "dp", "ep")


# -- jobs -----------------------------------------------------------------------------------------
class JobsView(BaseModel):
    rows: list[JobRow]
    phases: list[str]
    namespaces: list[str]
    phase: str | None
    namespace: str | None
    live: bool


def jobs_view(store: Store, phase: str | None, namespace: str | None) -> JobsView:
    rows = read_jobs(store)
    namespaces = sorted({r.namespace for r in rows})
    shown = [r for r in rows if (not phase or r.phase.value == phase) and (not namespace or r.namespace == namespace)]
    return JobsView(
        rows=shown,
        phases=[p.value for p in JobPhase],
        namespaces=namespaces,
        phase=phase,
        namespace=namespace,
        live=any(not r.phase.terminal for r in rows),
    )


# -- one job --------------------------------------------------------------------------------------
class RankCell(BaseModel):
    rank: int
    health: str
    step: int | None
    loss: float | None
    step_time: float | None
    progress_age: float | None
    straggler: bool
    groups: dict[str, int]  # tp, pp, dp (cp, ep when the layout has them) -> the index of the rank's group


class NodeCard(BaseModel):
    row: NodeRow
    cells: list[RankCell]


class Segment(BaseModel):
    """A stretch of the job's life on the timeline: training in a generation, or down after a failure."""

    kind: str  # pending, running, down, suspended
    start: float
    end: float
    generation: int | None
    label: str


class TimelineMark(BaseModel):
    at: float
    kind: str  # generation, incident, suspended, resumed, finished
    label: str
    incident: str | None = None


class AuditRow(BaseModel):
    id: str  # the audit entry's id (the request's, for a request made elsewhere)
    at: float
    actor: str
    via: str
    action: str
    node: str | None
    reason: str
    status: str  # Pending, Done, Failed (the controller's answer), or Done for a spec change
    message: str | None
    request_id: str | None
    details: list[str] = []  # a check's verdict per node


class Layout(BaseModel):
    """The parallel layout the grid is drawn with: the job's spec's, or sizes given on the page."""

    describe: str  # "trainer: tp 2 x pp 1 x dp 2"
    kinds: list[str]  # the group kinds a rank is shown in (tp, pp, dp; cp and ep when used)
    source: str  # spec, page


class JobView(BaseModel):
    status: StatusReport
    namespace: str
    suspend_requested: bool
    live: bool
    layout: Layout | None
    nodes: list[NodeCard]
    standbys: list[NodeRow]
    others: list[NodeRow]  # evicted, idle
    segments: list[Segment]
    marks: list[TimelineMark]
    timeline_start: float
    timeline_end: float
    checkpoints: list[CheckpointEntry]
    # What the running ranks report (heartbeats): the newest step every rank saved, and the newest any did.
    reported_checkpoint: tuple[int, int] | None
    audit: list[AuditRow]
    now: float
    # Suspending, checkpoint first (stage SuspendSaving): the phase is Suspended but the workers still step.
    saving_before_suspend: bool = False
    nodes_stopped: bool = False  # suspending or suspended: whatever the last heartbeats say, no node runs


def page_topology(world: int, tp: int, pp: int) -> Topology | None:
    """A layout given on the page (as to `stalwart diagnose --tp --pp`): tp x pp must divide the world."""
    if world <= 0 or tp < 1 or pp < 1 or world % (tp * pp):
        return None
    return Topology((RoleLayout(role="page", first_rank=0, tp=tp, pp=pp, dp=world // (tp * pp)),))


def layout_of(topology: Topology, source: str) -> Layout:
    used = [k for k in SHOWN_KINDS if k in ("tp", "pp", "dp") or any(r.size(k) > 1 for r in topology.roles)]
    shown = topology.describe() if source == "spec" else topology.roles[0].describe()  # the page's has no role
    return Layout(describe=shown, kinds=used, source=source)


def rank_groups(topology: Topology, kinds: list[str]) -> dict[int, dict[str, int]]:
    """rank -> {kind: the index of its group of that kind}, from the job's one Topology."""
    out: dict[int, dict[str, int]] = {r: {} for r in range(topology.world_size)}
    for kind in kinds:
        for index, group in enumerate(topology.groups(cast(GroupKind, kind))):
            for rank in group:
                out[rank][kind] = index
    return out


def stragglers(ranks: list[RankRow]) -> set[int]:
    running = [r for r in ranks if r.health in ("ok", "stalled") and r.step is not None]
    if len(running) < 2:
        return set()
    front = max(r.step for r in running if r.step is not None)
    times = [r.step_time for r in running if r.step_time]
    typical = statistics.median(times) if times else 0.0
    quiet = max(STRAGGLER_FLOOR_SECONDS, STRAGGLER_STEP_TIMES * typical)
    out = set()
    for r in running:
        behind = r.step is not None and r.step < front and (r.progress_age or 0.0) > quiet
        slow = bool(typical and r.step_time and r.step_time > 1.5 * typical)
        if behind or slow:
            out.add(r.rank)
    return out


def node_cards(report: StatusReport, topology: Topology | None, layout: Layout | None) -> list[NodeCard]:
    by_rank = {r.rank: r for r in report.ranks}
    groups = rank_groups(topology, layout.kinds) if topology and layout else {}
    slow = stragglers(report.ranks)
    cards = []
    for row in report.nodes:
        if row.state not in ("up", "lost"):
            continue
        cells = []
        for rank in row.ranks:
            r = by_rank.get(rank)
            cells.append(
                RankCell(
                    rank=rank,
                    health=r.health if r else "missing",
                    step=r.step if r else None,
                    loss=r.loss if r else None,
                    step_time=r.step_time if r else None,
                    progress_age=r.progress_age if r else None,
                    straggler=rank in slow,
                    groups=groups.get(rank, {}),
                )
            )
        cards.append(NodeCard(row=row, cells=cells))
    return sorted(cards, key=lambda c: (c.row.node_rank is None, c.row.node_rank or 0, c.row.node))


def timeline(
    state: JobState, generations: list[Assignment], incidents: list[Incident], now: float
) -> tuple[list[Segment], list[TimelineMark]]:
    """From the records alone: a generation trains from its assignment until the next failure; the
    job is down from a failure until the first step after it (or the next generation, if none came)."""
    end = state.finished_at or now
    segments: list[Segment] = []
    marks: list[TimelineMark] = []
    gens = sorted(generations, key=lambda g: g.generation)
    first = gens[0].created_at if gens else end
    if first > state.created_at:
        segments.append(Segment(kind="pending", start=state.created_at, end=first, generation=None, label="pending"))
    for i, g in enumerate(gens):
        g_end = gens[i + 1].created_at if i + 1 < len(gens) else end
        marks.append(TimelineMark(at=g.created_at, kind="generation", label=f"generation {g.generation}"))
        segments.append(
            Segment(
                kind="running",
                start=g.created_at,
                end=max(g.created_at, g_end),
                generation=g.generation,
                label=f"generation {g.generation}",
            )
        )
    for inc in incidents:
        down_end = inc.first_step_at or end
        segments.append(
            Segment(
                kind="down",
                start=inc.failed_at,
                end=max(inc.failed_at, min(down_end, end)),
                generation=inc.generation,
                label=f"{inc.failure_class.value} ({inc.id})",
            )
        )
        marks.append(TimelineMark(at=inc.failed_at, kind="incident", label=inc.failure_class.value, incident=inc.id))
    for i, pause in enumerate(state.suspensions):  # spec.suspend: not training, and nobody's failure
        resumed = pause.ended_at
        segments.append(
            Segment(
                kind="suspended",
                start=pause.started_at,
                end=max(pause.started_at, min(resumed or end, end)),
                generation=None,
                label=f"suspended ({i + 1})",
            )
        )
        marks.append(TimelineMark(at=pause.started_at, kind="suspended", label="suspended"))
        if resumed is not None:
            marks.append(TimelineMark(at=resumed, kind="resumed", label="resumed"))
    if state.phase.terminal:
        marks.append(TimelineMark(at=end, kind="finished", label=state.phase.value))
    return segments, sorted(marks, key=lambda m: m.at)


def reported_checkpoint(ranks: list[RankRow]) -> tuple[int, int] | None:
    """(newest step every rank has saved, newest step any rank has), from the ranks' progress reports."""
    steps = [r.last_checkpoint_step for r in ranks if r.health not in ("missing", "crashed")]
    if not steps or any(s is None for s in steps):
        return None
    known = [s for s in steps if s is not None]
    return min(known), max(known)


def audit_rows(store: Store, job: str) -> list[AuditRow]:
    """The console's own entries, with the controller's answer, and the requests other tools made."""
    requests = {r.id: r for r in store.get_prefix(keys.requests_prefix(job), OperatorRequest)}
    rows = []
    for e in store.get_prefix(keys.audit_prefix(job), AuditEntry):
        req = requests.pop(e.request_id, None) if e.request_id else None
        rows.append(
            AuditRow(
                id=e.id,
                at=e.at,
                actor=e.actor,
                via=e.via,
                action=e.action,
                node=e.node,
                reason=e.reason,
                status=req.status.value if req else ("Done" if e.request_id is None else "Unknown"),
                message=req.message if req else ("spec changed" if e.request_id is None else None),
                request_id=e.request_id,
                details=check_details(req),
            )
        )
    for r in requests.values():  # from the CLI or the Kubernetes operator
        rows.append(
            AuditRow(
                id=r.id,
                at=r.requested_at,
                actor=r.requested_by or "unknown",
                via="request",
                action=r.kind.value,
                node=r.node,
                reason=r.reason,
                status=r.status.value,
                message=r.message,
                request_id=r.id,
                details=check_details(r),
            )
        )
    return sorted(rows, key=lambda r: r.at, reverse=True)


def check_details(request: OperatorRequest | None) -> list[str]:
    """A finished check's verdict per node ("node-1: passed", "node-2: failed: why"), as the
    controller wrote it into the request's result."""
    if request is None or request.kind is not RequestKind.CHECK or not isinstance(request.result, dict):
        return []
    out = []
    for node, verdict in sorted(request.result.items()):
        if not isinstance(verdict, dict):
            continue
        reasons = [str(r) for r in verdict.get("reasons") or []]
        out.append(f"{node}: passed" if verdict.get("passed") else f"{node}: failed: {'; '.join(reasons) or '?'}")
    return out


def job_view(store: Store, job: str, tp: int | None = None, pp: int | None = None) -> JobView:
    """The job as its page shows it: the grid in the spec's parallel layout, unless the page gives TP
    and PP (a job written by an older Stalwart has no layout in its spec)."""
    now = time.time()
    report = read_status(store, job)
    state = require_state(store, job)
    doc = spec_document(store, job)
    spec = (doc or {}).get("spec")
    generations = store.get_prefix(keys.generations_prefix(job), Assignment)
    incidents = sorted(store.get_prefix(keys.incidents_prefix(job), Incident), key=lambda i: i.failed_at)
    current = next((g for g in generations if g.generation == state.generation), None)
    world = current.world_size if current else 0
    topology: Topology | None
    if tp is not None or pp is not None:
        topology, source = page_topology(world, tp or 1, pp or 1), "page"
    else:
        topology, source = job_topology(store, job, current), "spec"
        if topology is not None and topology.world_size != world:
            topology = None  # a replay generation: a smaller copy of the job
    layout = layout_of(topology, source) if topology is not None else None
    # SuspendSaving is phase Suspended too, but its workers step until the checkpoint commits.
    suspended = report.phase is JobPhase.SUSPENDED and state.stage is not JobStage.SAVING
    segments, marks = timeline(state, generations, incidents, now)
    checkpoints = sorted(store.get_prefix(keys.checkpoints_prefix(job), CheckpointEntry), key=lambda c: -c.step)
    return JobView(
        status=report,
        namespace=job_namespace(doc),
        suspend_requested=bool(isinstance(spec, dict) and spec.get("suspend")),
        live=not report.phase.terminal,
        layout=layout,
        # A suspended job's nodes are stopped, whatever their last heartbeats (kept until their leases
        # lapse) still say: no grid, no standby pool, nothing to act on but Resume.
        nodes=node_cards(report, topology, layout) if not suspended else [],
        standbys=[n for n in report.nodes if n.state.startswith("standby")] if not suspended else [],
        others=[n for n in report.nodes if n.state in ("evicted", "idle")],
        segments=segments,
        marks=marks,
        timeline_start=state.created_at,
        timeline_end=max(state.finished_at or now, state.created_at + 1),
        checkpoints=checkpoints,
        reported_checkpoint=reported_checkpoint(report.ranks),
        audit=audit_rows(store, job),
        now=now,
        saving_before_suspend=state.stage is JobStage.SAVING,
        nodes_stopped=suspended,
    )
