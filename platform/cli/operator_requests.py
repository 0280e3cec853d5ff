"""The controller's answer to an operator request, as the on-call commands print it (the request
itself, and the wait for its answer, are stalwart.ops.requests)."""

from __future__ import annotations

import typer

from stalwart.cli.output import Output, show
from stalwart.ops.errors import EXIT_FAILED
from stalwart.store.records import OperatorRequest, RequestStatus


def outcome_code(request: OperatorRequest) -> int:
    return 0 if request.status is RequestStatus.DONE else EXIT_FAILED


def report(final: OperatorRequest, output: Output) -> None:
    """Print the controller's answer; exit non-zero unless it was done."""
    show(output, final, lambda _wide: request_view(final))
    code = outcome_code(final)
    if code:
        raise typer.Exit(code)


def request_view(request: OperatorRequest):  # type: ignore[no-untyped-def]
    """The controller's answer: status and message, then its result (a table per node when it has one)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    style = "bold green" if request.status is RequestStatus.DONE else "bold red"
    parts: list = [
        Text.assemble(
            (request.status.value, style),
            f"  {request.kind.value} {request.node or 'every node'}: {request.message or ''}",
        )
    ]
    result = request.result or {}
    # Per-node results come as {node: {...}} (the controller's check) or under "nodes": a table.
    nested = result.get("nodes")
    per_node = nested if _is_per_node(nested) else result if _is_per_node(result) else None
    if per_node:
        columns = list(dict.fromkeys(k for v in per_node.values() for k in v))
        t = Table(title="per node", title_justify="left")
        t.add_column("node")
        for col in columns:
            t.add_column(col, overflow="fold")
        for node, values in sorted(per_node.items()):
            t.add_row(node, *(_cell(values.get(c)) for c in columns))
        parts.append(t)
    for key, value in result.items():
        if per_node is not None and (per_node is result or (key == "nodes" and per_node is nested)):
            continue
        parts.append(Text(f"  {key}: {_cell(value)}"))
    return Group(*parts)


def _is_per_node(value: object) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(v, dict) for v in value.values())


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items()) or "-"
    return str(value)
