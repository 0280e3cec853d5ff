"""The `stalwart` command: `run` for users; `agent` and `controller` are what `run` starts."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from stalwart.cli.errors import print_error, print_note
from stalwart.logs import configure

app = typer.Typer(
    name="stalwart",
    help="Fault-tolerant LLM training: run jobs that survive crashes, lost nodes and hangs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,
)


def _register_groups() -> None:
    from stalwart.cli.checkpoint_cmd import app as checkpoint_app
    from stalwart.cli.dashboards_cmd import app as dashboards_app
    from stalwart.cli.data_cmd import app as data_app
    from stalwart.cli.on_call import register

    app.add_typer(checkpoint_app, name="checkpoint")
    app.add_typer(data_app, name="data")
    app.add_typer(dashboards_app, name="dashboards")
    register(app)


_register_groups()


def _fail(message: str, code: int = 2) -> typer.Exit:
    print_error(message)
    return typer.Exit(code)


@app.command()
def run(
    job_file: Annotated[Path, typer.Argument(help="TrainingJob YAML (apiVersion/kind/metadata/spec).")],
    inject: Annotated[
        list[str] | None,
        typer.Option(
            "--inject",
            help="Inject a fault, e.g. kill-worker:rank=1,step=20, kill-node:node=1,step=30, "
            "kill-controller:step=25, hang-worker:rank=1,step=20, slow-worker:rank=3,step=20, "
            "slow-data:rank=5,step=20,seconds=1, bad-node:node=1, pause-etcd:step=20,seconds=10, "
            "kill-etcd:step=20,seconds=5, restore-machine:step=40 (with --max-nodes: a lost machine comes "
            "back). Repeatable; add after=recovery to fire only once the job "
            "recovered from the faults fired before it.",
        ),
    ] = None,
    workdir: Annotated[
        Path | None, typer.Option(help="Folder for logs, etcd data and checkpoints (default: .stalwart/runs/JOB-TIME).")
    ] = None,
    etcd: Annotated[str | None, typer.Option(help="Use this etcd (HOST:PORT) instead of starting one.")] = None,
    summary_json: Annotated[Path | None, typer.Option(help="Also write the final summary here, as JSON.")] = None,
    timeout: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 3600.0,
    etcd_outage: Annotated[
        float | None,
        typer.Option(
            min=1,
            max=3600,
            help="Ride out an unreachable etcd this long (restarting the one it started) before stopping the job; "
            "sets the job's faultTolerance.etcdOutageSeconds (default 60), which its agents follow too.",
        ),
    ] = None,
    metrics_port: Annotated[
        int, typer.Option(help="Port of the job-metrics exporter (/metrics on 127.0.0.1); 0: any free port.")
    ] = 0,
    console: Annotated[
        int | None,
        typer.Option(
            "--console",
            metavar="PORT",
            min=1,
            max=65535,
            help="Also serve the web console on 127.0.0.1:PORT while the job runs (you may act in it).",
        ),
    ] = None,
    max_nodes: Annotated[
        int | None,
        typer.Option(
            "--max-nodes",
            min=1,
            help="The machines the run may use, standbys included; a killed node's machine is lost, so the "
            "job can run out of them as on a cluster (default: as many as it asks for).",
        ),
    ] = None,
) -> None:
    """Run a TrainingJob on this machine: etcd, a controller and node agents as local processes.

    Example: stalwart run examples/pretrain-tiny.yaml --inject kill-worker:rank=1,step=20

    With the web console: stalwart run examples/pretrain-tiny.yaml --console 8090
    """
    from stalwart.faults import parse_fault
    from stalwart.runner import JobAlreadyExists, LocalRun
    from stalwart.spec import SpecError, load_job

    try:
        job = load_job(job_file)
        faults = [parse_fault(f) for f in inject or []]
    except (SpecError, ValueError) as exc:
        raise _fail(str(exc)) from None
    workdir = workdir or Path(".stalwart/runs") / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        local = LocalRun(
            job,
            job_file,
            workdir,
            etcd_endpoint=etcd,
            faults=faults,
            timeout=timeout,
            metrics_port=metrics_port,
            console_port=console,
            etcd_outage_seconds=etcd_outage,
            max_nodes=max_nodes,
        )
    except ValueError as exc:  # faults or a machine limit that cannot work for this run
        raise _fail(str(exc)) from None
    try:
        result = local.run()
    except JobAlreadyExists as exc:
        raise _fail(str(exc)) from None
    if summary_json is not None:
        summary_json.write_text(result.model_dump_json(indent=2))
    raise typer.Exit(0 if result.phase.value == "Succeeded" else 1)


@app.command(hidden=True)
def agent(
    job: Annotated[str, typer.Option()],
    node: Annotated[str, typer.Option()],
    etcd: Annotated[str, typer.Option()],
    workdir: Annotated[Path, typer.Option()],
    job_dir: Annotated[Path, typer.Option()],
) -> None:
    """Run a node agent (started by the cluster backend, one per node)."""
    from stalwart.agents.agent import AgentExit, NodeAgent
    from stalwart.store import Store

    configure(os.environ.get("STALWART_LOG_LEVEL", "INFO"))
    try:
        code = NodeAgent(Store(etcd), job, node, workdir, job_dir).run()
    except AgentExit as exc:
        # A clean stop (the job finished) is not an error.
        (print_error if exc.code else print_note)(str(exc))
        code = exc.code
    raise typer.Exit(code)


@app.command(hidden=True)
def controller(
    job: Annotated[str, typer.Option()],
    etcd: Annotated[str, typer.Option()],
    workdir: Annotated[Path, typer.Option()],
    job_dir: Annotated[Path, typer.Option()],
) -> None:
    """Run the job controller with the local-process cluster backend."""
    from stalwart.cluster import LocalCluster
    from stalwart.controller import JobController
    from stalwart.faults.controller_faults import commit_hooks
    from stalwart.store import Store

    configure("INFO")
    cluster = LocalCluster(job, etcd, workdir, job_dir)
    try:
        phase = JobController(Store(etcd), cluster, job, after_commit=commit_hooks()).run()
    finally:
        cluster.close()
    raise typer.Exit(0 if phase.value in ("Succeeded", "Failed") else 1)


@app.command()
def version() -> None:
    """Print Stalwart's version."""
    from importlib.metadata import version as dist_version

    print(dist_version("stalwart"))


def main() -> int:
    from stalwart.cli.on_call import run_app

    return run_app(app, prog_name="stalwart")


def kubectl_main() -> int:
    """`kubectl stalwart ...`: kubectl finds `kubectl-stalwart` on PATH and runs it; as a kubectl
    plugin the CLI acts through the Kubernetes API (the kubeconfig) before any configured etcd."""
    from stalwart.cli.on_call import run_app
    from stalwart.ops.actions import PREFER_KUBERNETES_ENV

    os.environ[PREFER_KUBERNETES_ENV] = "1"
    return run_app(app, prog_name="kubectl stalwart")


if __name__ == "__main__":
    sys.exit(main())
