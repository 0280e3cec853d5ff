"""The on-call commands' -n/--namespace option and the way they act on a job (stalwart.ops.actions
chooses etcd or the Kubernetes API; the CLI shows its waits as a spinner)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from stalwart.cli.errors import err, print_note
from stalwart.ops import actions
from stalwart.ops.actions import JobActions

NAMESPACE_HELP = "The TrainingJob's namespace (default: the kubeconfig context's); with etcd, JOB becomes NS.JOB."
NamespaceOption = Annotated[str | None, typer.Option("--namespace", "-n", metavar="NS", help=NAMESPACE_HELP)]


def _reads_etcd_only(ctx: typer.Context, namespace: str | None) -> str | None:
    """Say, when -n is given to a command that reads etcd only, that the Kubernetes API is not asked."""
    if namespace and not ctx.resilient_parsing:  # not while a shell completes a word
        print_note(
            f"{ctx.command_path} reads etcd, not the Kubernetes API: namespace {namespace} selects the jobs "
            f"submitted there (etcd ids {namespace}.JOB)"
        )
    return namespace


# The commands that only read etcd take the same option; their help, and a note when it is given, say so.
ReadNamespaceOption = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        "-n",
        metavar="NS",
        callback=_reads_etcd_only,
        help="The job's namespace. This command reads etcd only (not the Kubernetes API): JOB becomes NS.JOB, "
        "and a listing keeps that namespace's jobs.",
    ),
]


@contextmanager
def open_actions(etcd: str | None, namespace: str | None) -> Iterator[JobActions]:
    """stalwart.ops.actions.open_actions, its waits shown as a spinner on stderr."""
    with actions.open_actions(etcd, namespace, waiting=err.status) as found:
        yield found
