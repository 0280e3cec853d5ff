"""`stalwart diagnose JOB`: capture every rank's stack now, run the diagnosis, print the verdict.

The evidence is gathered the way the controller gathers it (a stack request every agent answers with
its workers' stacks and its node's recent metric window, the heartbeats' log tails, the parallel
layout from the job's spec), so what on-call sees is what the controller would decide on. The
verdict comes from the diagnosis service when one is configured or published in etcd, else from the
same engine run in this process; the output says which.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from stalwart.cli.connection import DiagnosisUrlOption, EtcdOption, open_store, resolve
from stalwart.cli.errors import EXIT_USAGE, CliError, cli_errors, err, print_note
from stalwart.cli.lookup import JobArg, current_assignment, job_topology, require_state
from stalwart.cli.output import OutputFormat, OutputOption, out, print_json
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.nodes import read_nodes
from stalwart.store.records import Assignment, JobState, ServiceEndpoint, StackReport

if TYPE_CHECKING:
    from stalwart.diagnosis.models import EvidenceBundle
    from stalwart.diagnosis.models import Topology as EngineTopology


class Kind(str, Enum):
    """What to look for (the diagnosis models' `kind`); auto: whatever the evidence shows."""

    AUTO = "auto"
    HANG = "hang"
    SLOWDOWN = "slowdown"
    CRASH = "crash"
    METRICS = "metrics"


def topology_sizes(world: int, tp: int, pp: int, dp: int | None) -> tuple[int, int, int]:
    """tp × pp × dp must be the world size; dp defaults to what is left."""
    if world % (tp * pp):
        raise CliError(f"--tp {tp} × --pp {pp} does not divide the world size {world}", EXIT_USAGE)
    dp = dp or world // (tp * pp)
    if tp * pp * dp != world:
        raise CliError(f"--tp {tp} × --pp {pp} × --dp {dp} = {tp * pp * dp}, not the world size {world}", EXIT_USAGE)
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
            raise CliError(f"job {job!r}: its spec in etcd gives no layout for this generation; pass --tp/--pp")
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


def run_diagnosis(  # type: ignore[no-untyped-def]
    bundle,
    url: str | None,
    source: str,
    local: bool,
    on_note: Callable[[str], None] = print_note,
    token: str | None = None,
):
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


def layout_text(bundle: EvidenceBundle) -> str:
    t = bundle.topology
    return f"tp {t.tp} × pp {t.pp} × dp {t.dp}" if t is not None else "unknown"


@cli_errors
def diagnose(
    job: JobArg,
    kind: Annotated[Kind, typer.Option(help="What to look for; auto: whatever the evidence shows.")] = Kind.AUTO,
    tp: Annotated[
        int | None, typer.Option(min=1, help="Override the job's tensor-parallel size (default: from its spec).")
    ] = None,
    pp: Annotated[
        int | None, typer.Option(min=1, help="Override the job's pipeline-parallel size (default: from its spec).")
    ] = None,
    dp: Annotated[
        int | None, typer.Option(min=1, help="Override the data-parallel size (default: what is left).")
    ] = None,
    local: Annotated[bool, typer.Option("--local", help="Use the engine in this process, not the service.")] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for every node's stacks.")] = 30.0,
    save_bundle: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Also write the evidence bundle here (JSON), for a ticket.")
    ] = None,
    diagnosis_url: DiagnosisUrlOption = None,
    etcd: EtcdOption = None,
    output: OutputOption = OutputFormat.TABLE,
) -> None:
    """Capture every rank's stack now, diagnose the job, and print the verdict and the stack groups.

    The verdict: the failure class, suspect nodes with scores and reasons, their parallel group, the runbook.

    The stack groups: ranks with the same stack; in a hang, the outlier group is where it starts.

    The parallel layout (TP, PP, DP groups) comes from the job's spec; --tp/--pp/--dp override it.
    Each node's last minute of metrics (step and phase times, GPU and host readings) goes with it.

    Examples:

        stalwart diagnose pretrain-tiny

        stalwart diagnose pretrain-3d --kind hang

        stalwart diagnose pretrain-tiny --local --save-bundle bundle.json -o json
    """
    try:
        import stalwart.diagnosis.models  # noqa: F401
    except ImportError as exc:
        raise CliError(f"the diagnosis package is not available here ({exc})") from None
    from stalwart.cli.verdict_view import verdict_view

    with open_store(etcd) as store:
        state = require_state(store, job)
        assignment = current_assignment(store, state)
        with err.status(
            f"capturing the stacks of {assignment.world_size} ranks on {len(assignment.nodes)} nodes "
            f"(up to {timeout:.0f}s)"
        ):
            captured_now = capture(store, state, assignment, kind.value, (tp, pp, dp), timeout)
        if captured_now.silent:
            print_note(
                f"no stacks from {', '.join(captured_now.silent)} within {timeout:.0f}s: diagnosing without them"
            )
        bundle = captured_now.bundle
        url, source = service_url(store, diagnosis_url)
        token = service_token(store) if url and not local else None
    if save_bundle is not None:
        save_bundle.write_text(bundle.model_dump_json(indent=2))
    verdict, by = run_diagnosis(bundle, url, source, local, token=token)
    if output is OutputFormat.JSON:
        print_json(verdict)
        return
    captured = sum(1 for s in bundle.stacks if s.text)
    samples = max((len(next(iter(m.series.values()), [])) for m in bundle.metrics), default=0)
    out.print(
        verdict_view(
            verdict.model_dump(mode="json"),
            title=f"verdict · {job} generation {state.generation}",
            rank_nodes=bundle.topology.rank_nodes if bundle.topology else {},
        )
    )
    out.print(
        f"[dim]diagnosed by {by} from {captured} of {assignment.world_size} stacks and {samples} metric "
        f"samples of {len(bundle.metrics)} nodes, captured in {captured_now.seconds:.1f}s; layout "
        f"{layout_text(bundle)}[/]",
        highlight=False,
    )
