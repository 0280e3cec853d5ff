"""Rendering for the on-call commands: rich tables for people, JSON for scripts (`--output json`)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from enum import Enum
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console

from stalwart.styles import terminal_width


class OutputFormat(str, Enum):
    TABLE = "table"
    JSON = "json"


OutputOption = Annotated[
    OutputFormat,
    typer.Option("--output", "-o", case_sensitive=False, help="table for people, json for scripts."),
]

out = Console(width=terminal_width())


def print_json(data: BaseModel | Sequence[BaseModel] | dict[str, Any] | list[Any]) -> None:
    """Plain JSON on stdout, no colours or wrapping: what `jq` expects."""
    if isinstance(data, BaseModel):
        payload: Any = data.model_dump(mode="json")
    elif isinstance(data, (list, tuple)):
        payload = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    else:
        payload = data
    print(json.dumps(payload, indent=2))


def duration(seconds: float | None) -> str:
    """12.3s, 4m05s, 3h12m, 2d04h: short enough for a table column."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f}s" if s < 10 else f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def ago(t: float | None, now: float | None = None) -> str:
    return "-" if t is None else f"{duration((now or time.time()) - t)} ago"


def clock(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def num(value: float | None, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio * 100:.1f}%"
