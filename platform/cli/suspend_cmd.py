"""`stalwart suspend JOB` / `stalwart resume JOB`: set or unset the job's `spec.suspend`, then wait
for it to be carried out. Through etcd (a `stalwart run` job: stalwart.ops.suspension) the job's
controller stops its workers and nodes; through the Kubernetes API (stalwart_operator.cli_actions)
the operator does, from the TrainingJob. Either way the state, incidents and checkpoints stay, no
incident or restart is counted, and resuming starts a new generation from the newest checkpoint.
`stalwart.ops.actions` says which way a command goes."""

from __future__ import annotations

from typing import Annotated

import typer

from stalwart.cli.connection import EtcdOption
from stalwart.cli.errors import cli_errors
from stalwart.cli.job_actions import NamespaceOption, open_actions
from stalwart.cli.output import out

JobName = Annotated[str, typer.Argument(metavar="JOB", help="The job's name (a TrainingJob's, or `stalwart jobs`').")]
TimeoutOption = Annotated[
    float, typer.Option(min=1, help="Seconds to wait for the controller (or the operator) to carry it out.")
]


@cli_errors
def suspend(
    job: JobName, namespace: NamespaceOption = None, timeout: TimeoutOption = 300.0, etcd: EtcdOption = None
) -> None:
    """Suspend a job: a running job's workers first save a checkpoint (the platform asks them, and
    waits up to checkpoint.saveBeforeSuspendSeconds), then they and the nodes (pods) stop; the state
    and checkpoints are kept until it is resumed, from that checkpoint.

    Examples:

        stalwart suspend pretrain-tiny -n ml

        kubectl stalwart suspend pretrain-tiny
    """
    _set_suspended(job, namespace, timeout, etcd, True)


@cli_errors
def resume(
    job: JobName, namespace: NamespaceOption = None, timeout: TimeoutOption = 300.0, etcd: EtcdOption = None
) -> None:
    """Resume a suspended job from its newest checkpoint.

    Examples:

        stalwart resume pretrain-tiny -n ml
    """
    _set_suspended(job, namespace, timeout, etcd, False)


def _set_suspended(job: str, namespace: str | None, timeout: float, etcd: str | None, suspended: bool) -> None:
    with open_actions(etcd, namespace) as actions:
        out.print(actions.suspend(job, suspended, timeout), highlight=False)
