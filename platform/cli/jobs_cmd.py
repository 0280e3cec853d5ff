"""`stalwart jobs`: every job in etcd, the first thing on-call looks at."""

from __future__ import annotations

from rich import box
from rich.table import Table

from stalwart.cli.connection import EtcdOption
from stalwart.cli.errors import cli_errors
from stalwart.cli.output import (
    OutputFormat,
    OutputOption,
    out,
    print_json,
)
from stalwart.ops.connection import open_store
from stalwart.ops.jobs import JobRow, read_jobs
from stalwart.ops.readable import duration, num, percent
from stalwart.styles import phase_text


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
