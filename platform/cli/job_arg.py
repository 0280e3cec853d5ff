"""The JOB argument of the on-call commands, with shell completion from etcd."""

from __future__ import annotations

from typing import Annotated

import typer

from stalwart.ops.connection import resolve, store_auth
from stalwart.ops.lookup import job_names
from stalwart.store.client import Store


def complete_job(incomplete: str) -> list[str]:
    """Shell completion for JOB: names from the etcd of STALWART_ETCD or the config file, or nothing.

    Completion must never hang a shell or print an error, so it waits one second at most.
    """
    try:
        conn = resolve()
        if conn.etcd is None:
            return []
        store = Store(conn.etcd, timeout=1.0, auth=store_auth())
        try:
            return [name for name in job_names(store) if name.startswith(incomplete)]
        finally:
            store.close()
    except Exception:
        return []


JobArg = Annotated[
    str, typer.Argument(metavar="JOB", autocompletion=complete_job, help="The job's name (stalwart jobs lists them).")
]
