"""One-line errors for the on-call commands: a person at 3 a.m. reads one line, not a traceback.

The errors and their exit codes are the operations layer's (stalwart.ops.errors); this module prints
them and ends the command with the code.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from stalwart.ops.errors import EXIT_FAILED, EXIT_UNREACHABLE, OpsError
from stalwart.store.client import StoreUnavailable

try:  # typer >= 0.2x carries its own copy of click; older typer runs on click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

DEBUG_ENV = "STALWART_DEBUG"

err = Console(stderr=True)

P = ParamSpec("P")
T = TypeVar("T")


def print_error(message: str) -> None:
    # soft_wrap: the one line stays one line however narrow the terminal.
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def print_note(message: str) -> None:
    """A remark about how the result was obtained (stderr: stdout stays clean for --output json)."""
    err.print(f"[dim]{escape(message)}[/]", highlight=False, soft_wrap=True)


def cli_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """Turn every failure of a command into one line and an exit code (STALWART_DEBUG=1 re-raises)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, click_exceptions.ClickException):
            raise
        except OpsError as exc:
            print_error(str(exc))
            raise typer.Exit(exc.code) from None
        except StoreUnavailable as exc:
            print_error(f"{exc} (set the endpoint with --etcd, STALWART_ETCD or ~/.config/stalwart/config.yaml)")
            raise typer.Exit(EXIT_UNREACHABLE) from None
        except KeyboardInterrupt:
            print_error("interrupted")
            raise typer.Exit(130) from None
        except Exception as exc:  # a bug: still one line, with the way to see the traceback
            if os.environ.get(DEBUG_ENV):
                raise
            print_error(f"unexpected {type(exc).__name__}: {exc} (STALWART_DEBUG=1 shows the traceback)")
            raise typer.Exit(EXIT_FAILED) from None

    return wrapper
