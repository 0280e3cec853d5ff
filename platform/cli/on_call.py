"""Wiring of the on-call commands into `stalwart`, and the top-level error handling.

Every on-call command reads etcd (flags, env or config file: connection.py); each module holds one
command or one group. `run_app` turns click's usage errors (a bad flag, a missing argument) into one
line and exit 2, where click would print a boxed usage message.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import typer

from stalwart.cli.errors import click_exceptions, print_error
from stalwart.ops.errors import EXIT_USAGE

PANEL = "On call"
COMMANDS = "stalwart.cli.commands"  # entry points: name -> a typer command (pyproject.toml)


def register(app: typer.Typer) -> None:
    from stalwart.cli import (
        check_cmd,
        diagnose_cmd,
        incidents_cmd,
        jobs_cmd,
        logs_cmd,
        node_cmd,
        runbook_cmd,
        status_cmd,
        suspend_cmd,
    )

    app.command("jobs", rich_help_panel=PANEL)(jobs_cmd.jobs)
    app.command("status", rich_help_panel=PANEL)(status_cmd.status)
    app.command("incidents", rich_help_panel=PANEL)(incidents_cmd.incidents)
    app.command("incident", rich_help_panel=PANEL)(incidents_cmd.incident)
    app.command("diagnose", rich_help_panel=PANEL)(diagnose_cmd.diagnose)
    app.command("check", rich_help_panel=PANEL)(check_cmd.check)
    app.command("logs", rich_help_panel=PANEL)(logs_cmd.logs)
    app.command("suspend", rich_help_panel=PANEL)(suspend_cmd.suspend)
    app.command("resume", rich_help_panel=PANEL)(suspend_cmd.resume)
    app.add_typer(node_cmd.app, name="node", rich_help_panel=PANEL)
    app.add_typer(runbook_cmd.app, name="runbook", rich_help_panel=PANEL)
    _register_console(app)


def _register_console(app: typer.Typer) -> None:
    """Commands other layers bring (`stalwart console`, the web console's own): found through the
    `stalwart.cli.commands` entry points, so the CLI imports none of them."""
    for found in sorted(entry_points(group=COMMANDS), key=lambda e: e.name):
        app.command(found.name, rich_help_panel=PANEL)(found.load())


def run_app(app: typer.Typer, prog_name: str) -> int:
    """Run the CLI; usage errors are one line naming the command's --help, never a box or a traceback."""
    try:
        code = app(prog_name=prog_name, standalone_mode=False)
    except click_exceptions.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `stalwart node`: the help is the answer
            typer.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
            return EXIT_USAGE
        where = exc.ctx.command_path if exc.ctx else prog_name
        print_error(f"{exc.format_message()} (see: {where} --help)")
        return EXIT_USAGE
    except typer.Abort:
        print_error("aborted")
        return 1
    except click_exceptions.ClickException as exc:
        print_error(exc.format_message())
        return exc.exit_code
    return code if isinstance(code, int) else 0
