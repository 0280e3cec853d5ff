"""Rendering for the on-call commands, one implementation for all of them: `-o table` (default) and
`-o wide` for people, `-o json`, `-o yaml` and `-o jsonpath=TEMPLATE` for scripts, and `--watch`.

The JSON and YAML forms are the operations layer's typed results (stalwart.ops: pydantic models)
serialized as they are, so a script reads the same fields the console does. A list is a plain JSON
array; `-o jsonpath` sees it as kubectl sees a list, `{"items": [...]}`, so `{.items[*].job}` works.

jsonpath is kubectl's template syntax for the common cases: text with `{EXPR}` parts, each replaced
by its matches joined with spaces (strings as they are, other values as JSON); `{"\\n"}` is literal
text. EXPR is a JSONPath evaluated by jsonpath-ng (`.items[*].job`, `.ranks[0].health`,
`.items[?(@.phase=="Running")].job`, `..rank`). kubectl's `range`/`end` blocks are not supported.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, TypeVar

import typer
import yaml
from pydantic import BaseModel
from rich.console import Console, RenderableType
from rich.live import Live

from stalwart.styles import terminal_width


class OutputFormat(str, Enum):
    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"
    JSONPATH = "jsonpath"


@dataclass(frozen=True)
class Output:
    """What `-o` asked for: a format, and the template when it is jsonpath."""

    format: OutputFormat = OutputFormat.TABLE
    template: str | None = None

    @property
    def human(self) -> bool:
        return self.format in (OutputFormat.TABLE, OutputFormat.WIDE)

    @property
    def wide(self) -> bool:
        return self.format is OutputFormat.WIDE


TABLE = Output()
FORMATS_HELP = "table (default), wide (more columns), json, yaml, or jsonpath=TEMPLATE (e.g. '{.items[*].job}')."


def parse_output(value: str | Output) -> Output:
    """`-o` as kubectl takes it: a format name, or jsonpath=TEMPLATE."""
    if isinstance(value, Output):
        return value
    name, sep, template = value.partition("=")
    try:
        fmt = OutputFormat(name.strip().lower())
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an output format: {FORMATS_HELP}") from None
    if fmt is OutputFormat.JSONPATH:
        if not sep or not template.strip():
            raise typer.BadParameter("jsonpath needs a template: -o jsonpath='{.items[*].job}'")
        compile_template(template)  # a bad expression is a usage error, before anything is read
        return Output(fmt, template)
    if sep:
        raise typer.BadParameter(f"-o {fmt.value} takes no '=...' (only jsonpath does)")
    return Output(fmt)


OutputOption = Annotated[
    Output,
    typer.Option("--output", "-o", metavar="FORMAT", parser=parse_output, help=FORMATS_HELP),
]

out = Console(width=terminal_width())


def plain(data: BaseModel | Sequence[BaseModel] | dict[str, Any] | list[Any]) -> Any:
    """The JSON form: models dumped in JSON mode, lists of them as arrays."""
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, (list, tuple)):
        return [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    return data


def print_json(data: BaseModel | Sequence[BaseModel] | dict[str, Any] | list[Any]) -> None:
    """Plain JSON on stdout, no colours or wrapping: what `jq` expects."""
    print(json.dumps(plain(data), indent=2))


_PART = re.compile(r"\{([^{}]*)\}")


def compile_template(template: str) -> list[str | Any]:
    """The template's literal text and parsed expressions, in order; BadParameter names a bad part."""
    from jsonpath_ng.exceptions import JsonPathLexerError, JsonPathParserError
    from jsonpath_ng.ext import parse

    parts: list[str | Any] = []
    pos = 0
    for m in _PART.finditer(template):
        parts.append(template[pos : m.start()])
        expr = m.group(1).strip()
        pos = m.end()
        if len(expr) >= 2 and expr[0] == expr[-1] and expr[0] in "\"'":  # {"\n"}: literal text
            parts.append(expr[1:-1].encode().decode("unicode_escape"))
            continue
        if expr.split(" ", 1)[0] in ("range", "end"):
            raise typer.BadParameter(f"jsonpath {{{expr}}}: range/end blocks are not supported (use -o json and jq)")
        path = "$" + expr if expr.startswith((".", "[")) else expr if expr.startswith("$") else "$." + expr
        try:
            parts.append(parse(path))
        except (JsonPathLexerError, JsonPathParserError, ValueError, TypeError) as exc:
            raise typer.BadParameter(f"jsonpath {{{expr}}} is not a JSONPath expression: {exc}") from None
    parts.append(template[pos:])
    if not any(not isinstance(p, str) for p in parts) and "{" not in template:
        raise typer.BadParameter(f"jsonpath {template!r} has no {{EXPR}} part: write it as '{{{template}}}'")
    return parts


def render_jsonpath(template: str, data: Any) -> str:
    """kubectl's jsonpath output: each {EXPR} becomes its matches joined with spaces."""
    root = {"items": data} if isinstance(data, list) else data
    text = []
    for part in compile_template(template):
        if isinstance(part, str):
            text.append(part)
            continue
        values = [m.value for m in part.find(root)]
        text.append(" ".join(v if isinstance(v, str) else json.dumps(v) for v in values))
    return "".join(text)


def machine_text(output: Output, data: Any) -> str:
    """The JSON, YAML or jsonpath text of `data` (already in JSON form)."""
    if output.format is OutputFormat.YAML:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip("\n")
    if output.format is OutputFormat.JSONPATH:
        return render_jsonpath(output.template or "", data)
    return json.dumps(data, indent=2)


def show(
    output: Output,
    data: BaseModel | Sequence[BaseModel] | dict[str, Any] | list[Any],
    human: Callable[[bool], RenderableType | str],
) -> None:
    """Print `data` as `output` asks: the machine forms from the data itself, tables from `human(wide)`."""
    if output.human:
        view = human(output.wide)
        if isinstance(view, str):
            out.print(view, highlight=False)
        else:
            out.print(view)
        return
    print(machine_text(output, plain(data)))


T = TypeVar("T")
# Fields that move with the clock alone: a watch re-renders when something else changes.
CLOCK_FIELDS = frozenset(
    {"age_seconds", "heartbeat_age", "progress_age", "ettr", "downtime_seconds", "window_seconds", "lost_work_seconds"}
)


def _without_clock(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_clock(v) for k, v in data.items() if k not in CLOCK_FIELDS}
    if isinstance(data, list):
        return [_without_clock(v) for v in data]
    return data


def watch(
    output: Output,
    read: Callable[[], T],
    form: Callable[[T], BaseModel | Sequence[BaseModel] | dict[str, Any] | list[Any]],
    human: Callable[[T, bool], RenderableType | str],
    finished: Callable[[T], bool] = lambda _value: False,
    interval: float = 1.0,
    timeout: float | None = None,
) -> None:
    """`--watch`: read every `interval` seconds until `finished`, `timeout` or Ctrl-C.

    On a terminal a table is redrawn in place at each read (ages tick); otherwise, and for the machine
    forms, a new document is printed each time the result changes (clock-only changes aside), as
    `kubectl get -w` does."""
    deadline = None if timeout is None else time.monotonic() + timeout
    live_table = output.human and out.is_terminal
    last: Any = None
    live = Live(console=out, auto_refresh=False) if live_table else None
    try:
        if live is not None:
            live.start()
        while True:
            value = read()
            data = plain(form(value))
            changed = _without_clock(data) != last
            last = _without_clock(data)
            if live is not None:
                live.update(human(value, output.wide), refresh=True)
            elif changed:
                show(output, data, functools.partial(human, value))
                sys.stdout.flush()
            if finished(value) or (deadline is not None and time.monotonic() >= deadline):
                return
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))
    except KeyboardInterrupt:  # Ctrl-C ends a watch: not an error
        return
    finally:
        if live is not None:
            live.stop()


WatchOption = Annotated[
    bool, typer.Option("--watch", "-w", help="Keep watching: re-render on change until Ctrl-C (or --watch-timeout).")
]
WatchTimeoutOption = Annotated[
    float | None, typer.Option("--watch-timeout", metavar="SECONDS", min=0, help="Stop watching after this long.")
]
