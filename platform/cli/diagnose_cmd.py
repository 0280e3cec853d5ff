"""`stalwart diagnose JOB`: capture every rank's stack now, run the diagnosis, print the verdict.

The evidence is gathered the way the controller gathers it (a stack request every agent answers, the
heartbeats' metric vectors and log tails), so what on-call sees is what the controller would decide
on. The verdict comes from the diagnosis service when one is configured or published in etcd, else
from the same engine run in this process; the output says which.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from stalwart.cli.connection import DiagnosisUrlOption, EtcdOption, open_store, resolve
from stalwart.cli.errors import EXIT_USAGE, CliError, cli_errors, err, print_note
from stalwart.cli.lookup import JobArg, current_assignment, require_state
from stalwart.cli.output import OutputFormat, OutputOption, out, print_json
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.nodes import read_nodes
from stalwart.store.records import Assignment, JobState, ServiceEndpoint, StackReport

if TYPE_CHECKING:
    from stalwart.diagnosis.models import EvidenceBundle


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


def build_bundle(
    store: Store,
    state: JobState,
    assignment: Assignment,
    reports: list[StackReport],
    kind: str,
    sizes: tuple[int, int, int],
) -> EvidenceBundle:
    """The EvidenceBundle: topology from the generation's assignment, stacks, metric vectors, log tails."""
    from stalwart.diagnosis.models import (
        EvidenceBundle,
        NodeMetrics,
        RankLog,
        Topology,
        rank_stacks,
    )

    owners = assignment.rank_nodes()
    tp, pp, dp = sizes
    stacks = rank_stacks(reports)
    beats = read_nodes(store, state.job).heartbeats
    metrics, logs = [], []
    for node in (n.node for n in assignment.nodes):
        beat = beats.get(node)
        if beat is None or beat.generation != state.generation:
            continue
        vector: dict[str, Any] = beat.vector or {}
        series = {k: [float(v)] for k, v in vector.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        metrics.append(NodeMetrics(node=node, series=series))
        for w in beat.workers:
            if w.log_tail or w.exit_code is not None:
                logs.append(RankLog(rank=w.rank, node=node, exit_code=w.exit_code, lines=w.log_tail))
    return EvidenceBundle(
        job=state.job,
        generation=state.generation,
        kind=kind,
        topology=Topology(world_size=assignment.world_size, tp=tp, pp=pp, dp=dp, rank_nodes=owners),
        stacks=stacks,
        metrics=metrics,
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
    store: Store, state: JobState, assignment: Assignment, kind: str, sizes: tuple[int, int, int], timeout: float
) -> Capture:
    """Ask every agent for its workers' stacks (as the controller does) and build the evidence bundle."""
    from stalwart.controller.stack_collection import collect_stacks, request_stacks

    nodes = [n.node for n in assignment.nodes]
    started = time.monotonic()
    reports = collect_stacks(store, state.job, request_stacks(store, state.job), nodes, timeout=timeout)
    silent = sorted(set(nodes) - {r.node for r in reports})
    bundle = build_bundle(store, state, assignment, reports, kind, sizes)
    return Capture(state, assignment, bundle, silent, time.monotonic() - started)


@cli_errors
def diagnose(
    job: JobArg,
    kind: Annotated[Kind, typer.Option(help="What to look for; auto: whatever the evidence shows.")] = Kind.AUTO,
    tp: Annotated[int, typer.Option(min=1, help="Tensor-parallel size (ranks of a TP group are consecutive).")] = 1,
    pp: Annotated[int, typer.Option(min=1, help="Pipeline-parallel size.")] = 1,
    dp: Annotated[int | None, typer.Option(min=1, help="Data-parallel size (default: world / (tp × pp)).")] = None,
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

    Examples:

        stalwart diagnose pretrain-tiny

        stalwart diagnose pretrain-tiny --kind hang --tp 2

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
        sizes = topology_sizes(assignment.world_size, tp, pp, dp)
        with err.status(
            f"capturing the stacks of {assignment.world_size} ranks on {len(assignment.nodes)} nodes "
            f"(up to {timeout:.0f}s)"
        ):
            captured_now = capture(store, state, assignment, kind.value, sizes, timeout)
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
    out.print(
        verdict_view(
            verdict.model_dump(mode="json"),
            title=f"verdict · {job} generation {state.generation}",
            rank_nodes=bundle.topology.rank_nodes if bundle.topology else {},
        )
    )
    out.print(
        f"[dim]diagnosed by {by} from {captured} of {assignment.world_size} stacks, captured in "
        f"{captured_now.seconds:.1f}s[/]",
        highlight=False,
    )
