"""`stalwart logs JOB [--rank N] [-f]`: the tail of workers' output, fetched from their nodes now, and
with -f followed as they write (stalwart.ops.logs says how)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.rule import Rule
from rich.text import Text

from stalwart.cli.connection import EtcdOption
from stalwart.cli.errors import cli_errors, err, print_note
from stalwart.cli.job_actions import ReadNamespaceOption
from stalwart.cli.job_arg import JobArg
from stalwart.cli.output import TABLE, OutputOption, machine_text, out, show
from stalwart.ops.connection import open_store
from stalwart.ops.logs import RankOutput, follow_logs, read_logs
from stalwart.ops.lookup import qualified_job
from stalwart.ops.readable import num


def print_rank(r: RankOutput) -> None:
    exit_text = f" · exited {num(r.exit_code)}" if r.exit_code is not None else ""
    out.print(Rule(f"rank {r.rank} · {r.node}{exit_text}", align="left", style="cyan"))
    for line in r.lines:
        out.print(Text(line), soft_wrap=True)


@cli_errors
def logs(
    job: JobArg,
    rank: Annotated[
        int | None, typer.Option("--rank", "-r", min=0, help="Only this rank (default: every rank).")
    ] = None,
    tail: Annotated[
        int, typer.Option("--tail", "--lines", min=1, max=10_000, help="Lines per rank (the last N).")
    ] = 100,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Keep printing new lines as they come, until the job (or the rank) ends or Ctrl-C."
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for the nodes to answer.")] = 15.0,
    etcd: EtcdOption = None,
    namespace: ReadNamespaceOption = None,
    output: OutputOption = TABLE,
) -> None:
    """Show the tail of workers' output (stdout and stderr), fetched from their nodes now.

    With -f, new lines follow as the nodes report them (every second); the machine forms then print
    one document per rank and batch of new lines.

    Examples:

        stalwart logs pretrain-tiny --rank 3

        stalwart logs pretrain-tiny --tail 20

        stalwart logs pretrain-tiny -r 0 -f

        stalwart logs pretrain-tiny -o json | jq -r '.[] | select(.rank == 0) | .lines[]'
    """
    name = qualified_job(job, namespace)
    with open_store(etcd) as store:
        if follow:
            try:
                for r in follow_logs(store, name, rank, tail, timeout, on_note=print_note):
                    if output.human:
                        print_rank(r)
                    else:
                        print(machine_text(output, r.model_dump(mode="json")), flush=True)
            except KeyboardInterrupt:  # Ctrl-C ends a follow: not an error
                pass
            return
        with err.status(f"asking the job's nodes for their workers' output (up to {timeout:.0f}s)"):
            found = read_logs(store, name, rank, tail, timeout, on_note=print_note)

    if output.human:
        for r in found:
            print_rank(r)
        return
    show(output, found, lambda _wide: "")
