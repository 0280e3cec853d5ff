"""The on-call commands' -n/--namespace option and the way they act on a job (stalwart.ops.actions
chooses etcd or the Kubernetes API; the CLI shows its waits as a spinner)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from stalwart.cli.errors import err
from stalwart.ops import actions
from stalwart.ops.actions import JobActions

NAMESPACE_HELP = "The TrainingJob's namespace (default: the kubeconfig context's); with etcd, JOB becomes NS.JOB."
NamespaceOption = Annotated[str | None, typer.Option("--namespace", "-n", metavar="NS", help=NAMESPACE_HELP)]
# The commands that only read etcd take the same option, and their help says that they read etcd.
ReadNamespaceOption = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        "-n",
        metavar="NS",
        help="The job's namespace. This command reads etcd only (not the Kubernetes API): JOB becomes NS.JOB, "
        "and a listing keeps that namespace's jobs.",
    ),
]


@contextmanager
def open_actions(etcd: str | None, namespace: str | None) -> Iterator[JobActions]:
    """stalwart.ops.actions.open_actions, its waits shown as a spinner on stderr."""
    with actions.open_actions(etcd, namespace, waiting=err.status) as found:
        yield found
