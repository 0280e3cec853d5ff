"""`stalwart diagnose JOB`: capture every rank's stack now, run the diagnosis, print the verdict.

The evidence is gathered the way the controller gathers it (a stack request every agent answers with
its workers' stacks and its node's recent metric window, the heartbeats' log tails, the parallel
layout from the job's spec), so what on-call sees is what the controller would decide on. The
verdict comes from the diagnosis service when one is configured or published in etcd, else from the
same engine run in this process; the output says which (stalwart.ops.stacks does the work).
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from stalwart.cli.connection import DiagnosisUrlOption, EtcdOption
from stalwart.cli.errors import cli_errors, err, print_note
from stalwart.cli.job_actions import ReadNamespaceOption
from stalwart.cli.job_arg import JobArg
from stalwart.cli.output import TABLE, OutputOption, out, show
from stalwart.ops.connection import open_store
from stalwart.ops.errors import OpsError
from stalwart.ops.lookup import current_assignment, qualified_job, require_state
from stalwart.ops.stacks import capture, run_diagnosis, service_token, service_url

if TYPE_CHECKING:
    from stalwart.diagnosis.models import EvidenceBundle


class Kind(str, Enum):
    """What to look for (the diagnosis models' `kind`); auto: whatever the evidence shows."""

    AUTO = "auto"
    HANG = "hang"
    SLOWDOWN = "slowdown"
    CRASH = "crash"
    METRICS = "metrics"


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
    namespace: ReadNamespaceOption = None,
    output: OutputOption = TABLE,
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
        raise OpsError(f"the diagnosis package is not available here ({exc})") from None
    from stalwart.cli.verdict_view import verdict_view

    job = qualified_job(job, namespace)
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
    verdict, by = run_diagnosis(bundle, url, source, local, on_note=print_note, token=token)
    if not output.human:
        show(output, verdict, lambda _wide: "")
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
