"""Terminal styles shared by the on-call CLI and `stalwart run`'s live table: one look per phase."""

from __future__ import annotations

import os
import sys

from rich.text import Text

from stalwart.store.records import JobPhase

PHASE_STYLE: dict[JobPhase, str] = {
    JobPhase.PENDING: "yellow",
    JobPhase.RUNNING: "green",
    JobPhase.RESTARTING: "bold yellow",
    JobPhase.SUSPENDED: "dim",
    JobPhase.SUCCEEDED: "bold green",
    JobPhase.FAILED: "bold red",
}


def phase_text(phase: JobPhase) -> Text:
    """The phase's name in its colour (a phase without a style prints plain)."""
    return Text(phase.value, style=PHASE_STYLE.get(phase, ""))


def terminal_width() -> int | None:
    """None on a terminal (rich measures it); off one (a pipe, CI) 160 columns unless COLUMNS says,
    so tables of ids and paths are not cropped at rich's default of 80."""
    return None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
