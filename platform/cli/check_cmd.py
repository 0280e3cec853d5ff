"""`stalwart check NODE|JOB`: run the collective and compute health tests now, through the job's controller.

The checks need the GPUs the job is using, so the controller schedules them (between generations or
on a standby); the CLI asks and waits, as for an eviction.
"""

from __future__ import annotations

from typing import Annotated

import typer

from stalwart.cli import operator_requests
from stalwart.cli.connection import EtcdOption
from stalwart.cli.errors import cli_errors
from stalwart.cli.job_actions import NamespaceOption, open_actions
from stalwart.cli.output import TABLE, OutputOption
from stalwart.ops.errors import OpsError
from stalwart.store.records import RequestKind


@cli_errors
def check(
    target: Annotated[str, typer.Argument(metavar="NODE|JOB", help="A job (check all its nodes) or one node.")],
    job: Annotated[str | None, typer.Option("--job", "-j", help="TARGET is a node of this job.")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for the results.")] = 600.0,
    etcd: EtcdOption = None,
    namespace: NamespaceOption = None,
    output: OutputOption = TABLE,
) -> None:
    """Run the collective (all-reduce, all-gather, all-to-all: bandwidth and bitwise results) and compute checks now.

    TARGET is a job's name (every node of it) or a node's; with --job it is always a node.

    Nodes that fail are reported; evicting them is a separate decision (stalwart node evict).

    Examples:

        stalwart check pretrain-tiny

        stalwart check node-3 --job pretrain-tiny --timeout 900
    """
    with open_actions(etcd, namespace) as actions:
        node: str | None
        if job is None and actions.is_job(target):
            owner, node = actions.job_id(target), None
        else:
            found = actions.job_for_node(target, job)
            node = target
            if found is None:
                raise OpsError(f"{target!r} is neither a job nor a node of a running job ({actions.where})")
            owner = found
        final = actions.ask(owner, RequestKind.CHECK, node, "health check by on-call", timeout)
    operator_requests.report(final, output)
