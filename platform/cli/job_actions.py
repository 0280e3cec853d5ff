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

NamespaceOption = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        "-n",
        help="The TrainingJob's namespace (default: the kubeconfig context's); with etcd, JOB becomes NS.JOB.",
    ),
]


@contextmanager
def open_actions(etcd: str | None, namespace: str | None) -> Iterator[JobActions]:
    """stalwart.ops.actions.open_actions, its waits shown as a spinner on stderr."""
    with actions.open_actions(etcd, namespace, waiting=err.status) as found:
        yield found
