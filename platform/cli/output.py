"""Rendering for the on-call commands: rich tables for people, JSON for scripts (`--output json`)."""

from __future__ import annotations

import json
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
