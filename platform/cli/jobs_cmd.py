"""`stalwart jobs`: every job in etcd, the first thing on-call looks at."""

from __future__ import annotations

import time

from pydantic import BaseModel
from rich import box
from rich.table import Table

from stalwart.cli.connection import EtcdOption, open_store
from stalwart.cli.errors import cli_errors
from stalwart.cli.lookup import job_namespace, job_states, spec_document
from stalwart.cli.output import (
    OutputFormat,
    OutputOption,
    duration,
    num,
    out,
    percent,
    print_json,
)
from stalwart.store import keys
from stalwart.store.records import Incident, JobPhase
from stalwart.styles import phase_text


class JobRow(BaseModel):
    job: str
    namespace: str
    phase: JobPhase
    generation: int
    step: int | None
    restarts: int  # counted against maxRestarts
    infra_restarts: int  # caused by the infrastructure: not counted
    tokens_per_second: float | None
    ettr: float | None
    nodes_up: int
    nodes_total: int
    incidents: int
    age_seconds: float
    reason: str | None


def read_jobs(store) -> list[JobRow]:  # type: ignore[no-untyped-def]
    """One row per job, from its state, its incidents and a keys-only listing of its registered
    nodes: a few small reads per job whatever its size (no heartbeat, no stack report)."""
    from stalwart.controller.core.ettr import compute_ettr
    from stalwart.store.jobs import registered_nodes

    now = time.time()
    rows = []
    for state in job_states(store):
        name = state.job
        incidents = store.get_prefix(keys.incidents_prefix(name), Incident)
        registered = registered_nodes(store, name)
        rows.append(
            JobRow(
                job=name,
                namespace=job_namespace(spec_document(store, name)),
                phase=state.phase,
                generation=state.generation,
                step=state.last_step,
                restarts=state.restarts,
                infra_restarts=state.infra_restarts,
                tokens_per_second=state.last_tokens_per_second if state.phase is JobPhase.RUNNING else None,
                ettr=compute_ettr(state, incidents, now).ettr,
                nodes_up=sum(1 for s in state.slots if s in registered),
                nodes_total=len(state.slots),
                incidents=len(incidents),
                age_seconds=now - state.created_at,
                reason=state.reason,
            )
        )
    # Jobs that need attention first: unfinished ones, then the rest; newest first within each.
    return sorted(rows, key=lambda r: (r.phase.terminal, r.age_seconds))


def jobs_table(rows: list[JobRow], endpoint: str) -> Table:
    t = Table(
        title="jobs", title_justify="left", caption=f"etcd {endpoint}", caption_justify="left", box=box.SIMPLE_HEAVY
    )
    for col, just in (
        ("job", "left"),
        ("phase", "left"),
        ("gen", "right"),
        ("step", "right"),
        ("restarts", "right"),
        ("ETTR", "right"),
        ("nodes", "right"),
        ("incidents", "right"),
        ("age", "right"),
    ):
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for r in rows:
        t.add_row(
            r.job,
            phase_text(r.phase),
            str(r.generation),
            num(r.step),
            str(r.restarts),
            percent(r.ettr),
            f"{r.nodes_up}/{r.nodes_total}",
            str(r.incidents),
            duration(r.age_seconds),
        )
    return t


@cli_errors
def jobs(etcd: EtcdOption = None, output: OutputOption = OutputFormat.TABLE) -> None:
    """List jobs: phase, generation, step, restarts, ETTR, nodes up and age.

    Unfinished jobs come first. ETTR is computed from the job's incidents (docs/control-plane.md).

    Examples:

        stalwart jobs --etcd 127.0.0.1:2379

        stalwart jobs -o json | jq '.[] | select(.phase == "Restarting") | .job'
    """
    with open_store(etcd) as store:
        rows = read_jobs(store)
        if output is OutputFormat.JSON:
            print_json(rows)
            return
        if not rows:
            out.print(f"no jobs in etcd at {store.endpoint}", highlight=False)
            return
        out.print(jobs_table(rows, store.endpoint))
