"""A job's picture at one moment, read from etcd: what the terminal view and the summary show."""

from __future__ import annotations

import time

from pydantic import BaseModel

from stalwart.controller.core.ettr import ClassMttr, EttrReport, RoleMttr, compute_ettr, mttr_by_class, mttr_by_role
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.nodes import NodeRecords, read_nodes
from stalwart.store.records import CheckpointEntry, Incident, JobPhase, JobState, WorkerStatus


class RoleView(BaseModel):
    """One role of a multi-role job: its own generation, restarts and incidents, and its workers."""

    role: str
    generation: int
    restart_scope: str
    restarts: int  # counted against maxRestarts, caused by this role
    infra_restarts: int
    restarted: int  # how often its workers were restarted (by its own failures or the job's)
    incidents: int
    workers_running: int
    world_size: int
    pids: list[int]  # its current workers' pids, by rank


class JobSnapshot(BaseModel):
    job: str
    phase: JobPhase
    generation: int
    restarts: int  # counted against maxRestarts
    infra_restarts: int  # caused by the infrastructure (evictions, lost nodes, hangs): not counted
    slots: list[str]
    standbys: list[str]
    evicted: list[str]
    agents: dict[str, int]  # node -> agent pid, for the nodes registered now
    step: int | None
    loss: float | None
    tokens_per_second: float | None
    nodes_up: int
    nodes_total: int
    reason: str | None
    message: str | None
    elapsed_seconds: float
    incidents: list[Incident]
    ettr: EttrReport
    mttr: list[ClassMttr]
    workers: list[WorkerStatus]
    checkpoints: list[CheckpointEntry] = []  # the job's catalog, newest first
    roles: list[RoleView] = []
    mttr_by_role: list[RoleMttr] = []


def snapshot(
    store: Store,
    job: str,
    now: float | None = None,
    *,
    read: tuple[JobState | None, NodeRecords] | None = None,
) -> JobSnapshot | None:
    """The job as etcd holds it; `read`: its state and nodes, when the caller has just read them."""
    now = now or time.time()
    state, nodes = read if read is not None else (store.get(keys.job_state(job), JobState), None)
    if state is None:
        return None
    nodes = nodes if nodes is not None else read_nodes(store, job)
    beats, registered = nodes.heartbeats, nodes.registrations
    workers = sorted(state.current_workers(beats), key=lambda w: w.rank)
    incidents = sorted(store.get_prefix(keys.incidents_prefix(job), Incident), key=lambda i: i.failed_at)
    steps = [w.step for w in workers if w.step is not None]
    rank0 = next((w for w in workers if w.rank == 0 and w.loss is not None), None)
    tps = [w.tokens_per_second for w in workers if w.tokens_per_second and w.exit_code is None]
    return JobSnapshot(
        job=job,
        phase=state.phase,
        generation=state.generation,
        restarts=state.restarts,
        infra_restarts=state.infra_restarts,
        slots=state.slots,
        standbys=state.standbys,
        evicted=state.evicted,
        agents={n: r.agent_pid for n, r in registered.items()},
        step=max(steps) if steps else state.last_step,
        loss=rank0.loss if rank0 else state.last_loss,
        tokens_per_second=sum(tps) if tps else None,
        nodes_up=sum(1 for s in state.slots if s in registered),
        nodes_total=len(state.slots),
        reason=state.reason,
        message=state.message,
        elapsed_seconds=(state.finished_at or now) - state.created_at,
        incidents=incidents,
        ettr=compute_ettr(state, incidents, now),
        mttr=mttr_by_class(incidents),
        workers=workers,
        checkpoints=sorted(store.get_prefix(keys.checkpoints_prefix(job), CheckpointEntry), key=lambda c: -c.step),
        roles=role_views(state, workers),
        mttr_by_role=mttr_by_role(incidents) if len(state.roles) > 1 else [],
    )


def role_views(state: JobState, workers: list[WorkerStatus]) -> list[RoleView]:
    out = []
    for r in state.roles.values():
        mine = [w for w in workers if r.first_rank <= w.rank < r.first_rank + r.world_size]
        out.append(
            RoleView(
                role=r.name,
                generation=r.generation,
                restart_scope=r.restart_scope,
                restarts=r.restarts,
                infra_restarts=r.infra_restarts,
                restarted=r.restarted,
                incidents=len(r.incidents),
                workers_running=sum(1 for w in mine if w.exit_code is None),
                world_size=r.world_size,
                pids=[w.pid for w in mine],
            )
        )
    return out
