"""Every rank's stack captured now, and a diagnosis of them (`stalwart diagnose`, the console's stacks page).

The evidence is gathered the way the controller gathers it (a stack request every agent answers with
its workers' stacks and its node's recent metric window, the heartbeats' log tails, the parallel
layout from the job's spec), so what on-call sees is what the controller would decide on. The
verdict comes from the diagnosis service when one is configured or published in etcd, else from the
same engine run in this process; the result says which.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from stalwart.ops.connection import resolve
from stalwart.ops.errors import EXIT_USAGE, OpsError
from stalwart.ops.lookup import current_assignment, job_topology, require_state
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.nodes import read_nodes
from stalwart.store.records import Assignment, JobState, ServiceEndpoint, StackReport

if TYPE_CHECKING:
    from stalwart.diagnosis.models import EvidenceBundle, Verdict
    from stalwart.diagnosis.models import Topology as EngineTopology


def topology_sizes(world: int, tp: int, pp: int, dp: int | None) -> tuple[int, int, int]:
    """tp × pp × dp must be the world size; dp defaults to what is left."""
    if world % (tp * pp):
        raise OpsError(f"--tp {tp} × --pp {pp} does not divide the world size {world}", EXIT_USAGE)
    dp = dp or world // (tp * pp)
    if tp * pp * dp != world:
        raise OpsError(f"--tp {tp} × --pp {pp} × --dp {dp} = {tp * pp * dp}, not the world size {world}", EXIT_USAGE)
    return tp, pp, dp


def engine_topology(
    store: Store, job: str, assignment: Assignment, overrides: tuple[int | None, int | None, int | None]
) -> EngineTopology:
    """The layout from the job's spec, unless --tp/--pp/--dp override it."""
    from stalwart.diagnosis.models import Topology as EngineTopology

    tp, pp, dp = overrides
    if tp is None and pp is None and dp is None:
        layout = job_topology(store, job, assignment)
        if layout is None or layout.world_size != assignment.world_size:
            raise OpsError(f"job {job!r}: its spec in etcd gives no layout for this generation; pass --tp/--pp")
        return EngineTopology.of(layout)
    tp, pp, dp = topology_sizes(assignment.world_size, tp or 1, pp or 1, dp)
    return EngineTopology(world_size=assignment.world_size, tp=tp, pp=pp, dp=dp, rank_nodes=assignment.rank_nodes())


def build_bundle(
    store: Store,
    state: JobState,
    assignment: Assignment,
    reports: list[StackReport],
    kind: str,
    topology: EngineTopology,
) -> EvidenceBundle:
    """The EvidenceBundle: the layout, stacks, each node's metric window, log tails."""
    from stalwart.controller.core.metric_windows import node_metrics
    from stalwart.diagnosis.models import EvidenceBundle, RankLog, rank_stacks

    beats = read_nodes(store, state.job).heartbeats
    logs = []
    for node in (n.node for n in assignment.nodes):
        beat = beats.get(node)
        if beat is None or beat.generation != state.generation:
            continue
        for w in beat.workers:
            if w.log_tail or w.exit_code is not None:
                logs.append(RankLog(rank=w.rank, node=node, exit_code=w.exit_code, lines=w.log_tail))
    return EvidenceBundle(
        job=state.job,
        generation=state.generation,
        kind=kind,
        topology=topology,
        stacks=rank_stacks(reports),
        metrics=node_metrics(reports, {}),
        logs=logs,
    )


def service_url(store: Store, flag: str | None) -> tuple[str | None, str]:
    """The service's URL and where it came from: flag, env, config file, then what it published in etcd."""
    conn = resolve(store.endpoint, flag)
    if conn.diagnosis_url:
        return conn.diagnosis_url, conn.diagnosis_source
    published = store.get(keys.service("diagnosis"), ServiceEndpoint)
    if published is not None:
        return published.url.rstrip("/"), "published in etcd"
    return None, "none configured or published"


def service_token(store: Store) -> str | None:
    """The service's bearer token: STALWART_DIAGNOSIS_TOKEN, else the one `stalwart run` published."""
    from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV
    from stalwart.store.credentials import service_token as published

    return os.environ.get(DIAGNOSIS_TOKEN_ENV) or published(store, "diagnosis")


def run_diagnosis(
    bundle: EvidenceBundle,
    url: str | None,
    source: str,
    local: bool,
    on_note: Callable[[str], None] = lambda _note: None,
    token: str | None = None,
) -> tuple[Verdict, str]:
    """(verdict, who diagnosed): the service when there is one and it answers, else the local engine."""
    from stalwart.diagnosis.engine import diagnose as local_diagnose

    if url and not local:
        from stalwart.diagnosis.client import (
            DiagnosisClient,
            DiagnosisRejected,
            DiagnosisUnavailable,
        )

        try:
            return DiagnosisClient(url, token=token).diagnose(bundle), f"the diagnosis service at {url} ({source})"
        except (DiagnosisUnavailable, DiagnosisRejected) as exc:
            on_note(f"diagnosis service at {url} ({source}): {exc}; diagnosing here instead")
    elif not local:
        on_note(f"no diagnosis service ({source}); diagnosing here with the local engine")
    return local_diagnose(bundle), "the local engine"


@dataclass
class Capture:
    """Every rank's stack captured now, with the evidence around it: what a diagnosis reads."""

    state: JobState
    assignment: Assignment
    bundle: EvidenceBundle
    silent: list[str]  # nodes that sent no stacks in time
    seconds: float


def capture(
    store: Store,
    state: JobState,
    assignment: Assignment,
    kind: str,
    overrides: tuple[int | None, int | None, int | None],
    timeout: float,
) -> Capture:
    """Ask every agent for its workers' stacks (as the controller does) and build the evidence bundle;
    the layout is the job's own unless `overrides` (tp, pp, dp) give another."""
    from stalwart.controller.shell.diagnosis import collect_stacks, request_stacks

    topology = engine_topology(store, state.job, assignment, overrides)
    nodes = [n.node for n in assignment.nodes]
    started = time.monotonic()
    reports = collect_stacks(store, state.job, request_stacks(store, state.job), nodes, timeout=timeout)
    reports = [r for r in reports if r.node in nodes]  # standbys answer too; only the generation's count
    silent = sorted(set(nodes) - {r.node for r in reports})
    bundle = build_bundle(store, state, assignment, reports, kind, topology)
    return Capture(state, assignment, bundle, silent, time.monotonic() - started)


class StacksNow(BaseModel):
    """Every rank's stack captured now and its verdict: what the console's stacks page shows."""

    generation: int
    verdict: dict[str, Any]
    by: str
    captured: int
    world: int
    seconds: float
    silent: list[str]
    notes: list[str]
    rank_nodes: dict[int, str]
    captured_at: float


def stacks_now(store: Store, job: str, tp: int | None, pp: int | None) -> StacksNow:
    """Capture every rank's stack now and diagnose them, as `stalwart diagnose JOB` does: what the
    console's stacks page shows. The layout is the job's own unless `tp` or `pp` give another."""
    state = require_state(store, job)
    assignment = current_assignment(store, state)
    # The job's own layout (its spec's parallelism), unless the page asks for another.
    layout = (tp or 1, pp or 1, None) if tp is not None or pp is not None else (None, None, None)
    taken = capture(store, state, assignment, "auto", layout, timeout=30.0)
    url, source = service_url(store, None)
    notes: list[str] = []
    token = service_token(store) if url else None
    verdict, by = run_diagnosis(taken.bundle, url, source, False, on_note=notes.append, token=token)
    return StacksNow(
        generation=state.generation,
        verdict=verdict.model_dump(mode="json"),
        by=by,
        captured=sum(1 for s in taken.bundle.stacks if s.text),
        world=assignment.world_size,
        seconds=taken.seconds,
        silent=taken.silent,
        notes=notes,
        rank_nodes=taken.bundle.topology.rank_nodes if taken.bundle.topology else {},
        captured_at=time.time(),
    )
