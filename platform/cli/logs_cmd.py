"""`stalwart logs JOB [--rank N]`: the tail of workers' output, fetched from their nodes now
(stalwart.ops.logs says how)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.rule import Rule
from rich.text import Text

from stalwart.cli.connection import EtcdOption
from stalwart.cli.errors import cli_errors, err, print_note
from stalwart.cli.job_arg import JobArg
from stalwart.cli.output import OutputFormat, OutputOption, out, print_json
from stalwart.ops.connection import open_store
from stalwart.ops.logs import read_logs
from stalwart.ops.readable import num


@cli_errors
def logs(
    job: JobArg,
    rank: Annotated[
        int | None, typer.Option("--rank", "-r", min=0, help="Only this rank (default: every rank).")
    ] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", min=1, max=10_000, help="Lines per rank.")] = 100,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for the nodes to answer.")] = 15.0,
    etcd: EtcdOption = None,
    output: OutputOption = OutputFormat.TABLE,
) -> None:
    """Show the tail of workers' output (stdout and stderr), fetched from their nodes now.

    Examples:

        stalwart logs pretrain-tiny --rank 3

        stalwart logs pretrain-tiny -n 20

        stalwart logs pretrain-tiny -o json | jq -r '.[] | select(.rank == 0) | .lines[]'
    """
    with (
        open_store(etcd) as store,
        err.status(f"asking the job's nodes for their workers' output (up to {timeout:.0f}s)"),
    ):
        found = read_logs(store, job, rank, lines, timeout, on_note=print_note)
    if output is OutputFormat.JSON:
        print_json(found)
        return
    for r in found:
        exit_text = f" · exited {num(r.exit_code)}" if r.exit_code is not None else ""
        out.print(Rule(f"rank {r.rank} · {r.node}{exit_text}", align="left", style="cyan"))
        for line in r.lines:
            out.print(Text(line), soft_wrap=True)
