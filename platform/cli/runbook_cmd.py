"""`stalwart runbook list|show`: the runbooks in runbooks/, read where the incident is being handled."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.table import Table

from stalwart.cli import output as rendering
from stalwart.cli.errors import cli_errors
from stalwart.cli.output import TABLE, OutputOption, out
from stalwart.ops.errors import OpsError
from stalwart.runbooks import Runbook, UnknownRunbook, list_runbooks, load_runbook, runbooks_dir

app = typer.Typer(help="Runbooks: what each failure class means and what to do about it.", no_args_is_help=True)


def complete_class(incomplete: str) -> list[str]:
    """Shell completion for CLASS: runbook ids (reading files only, never etcd)."""
    try:
        return [b.id for b in list_runbooks() if b.id.startswith(incomplete.replace("-", "_").lower())]
    except OSError:
        return []


@app.command("list")
@cli_errors
def list_cmd(output: OutputOption = TABLE) -> None:
    """List the runbooks: one per failure class of the signature database and of the controller.

    Examples:

        stalwart runbook list

        stalwart runbook list -o json | jq -r '.[].id'
    """
    books = list_runbooks()
    if not books:
        raise OpsError(f"no runbooks found in {runbooks_dir()} (STALWART_RUNBOOKS points at another folder)")
    rendering.show(output, books, lambda _wide: runbooks_table(books))


def runbooks_table(books: list[Runbook]) -> Table:
    t = Table(
        title="runbooks",
        title_justify="left",
        box=box.SIMPLE_HEAVY,
        caption="stalwart runbook show CLASS",
        caption_justify="left",
    )
    t.add_column("class", no_wrap=True, style="bold cyan")
    t.add_column("title", overflow="fold")
    for b in books:
        t.add_row(b.id, b.title)
    return t


@app.command()
@cli_errors
def show(
    failure_class: Annotated[
        str,
        typer.Argument(
            metavar="CLASS",
            autocompletion=complete_class,
            help="A failure class: nccl_timeout, nccl-timeout, Hang, NaNLoss, xid79...",
        ),
    ],
    raw: Annotated[bool, typer.Option("--raw", help="Print the markdown as it is (for a pager or a ticket).")] = False,
    output: OutputOption = TABLE,
) -> None:
    """Show a runbook: symptoms, what Stalwart already did, how to confirm, what to do, when to escalate.

    Examples:

        stalwart runbook show nccl-timeout

        stalwart runbook show Hang --raw | less
    """
    try:
        book = load_runbook(failure_class)
    except UnknownRunbook as exc:
        raise OpsError(str(exc)) from None
    if not output.human:
        rendering.show(output, book, lambda _wide: "")
    elif raw:
        print(book.text, end="")
    else:
        from rich.markdown import Markdown

        out.print(Markdown(book.text or "", code_theme="ansi_dark"))
