"""Asking a job's controller to act (evict, cordon, uncordon, check) and waiting for its answer.

The CLI never acts on a running job itself: two writers deciding about the same nodes would race. It
writes an OperatorRequest under the job's requests/ prefix; the controller carries it out and writes
the outcome (Done or Failed, a message, a result) into the same record. The wait is bounded; when it
runs out, the request is withdrawn with a compare-and-swap on its revision, so a controller that comes
back later does not evict a node the engineer has stopped expecting to be evicted.
"""

from __future__ import annotations

import getpass
import socket
import time
import uuid

import typer

from stalwart.cli.errors import EXIT_FAILED, EXIT_TIMEOUT, CliError, err
from stalwart.cli.output import OutputFormat, out, print_json
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import OperatorRequest, RequestKind, RequestStatus

POLL_SECONDS = 0.25
WITHDRAWN = "withdrawn by its requester: the controller did not take it up in time"


def requester() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()} (stalwart CLI)"


def new_request(kind: RequestKind, node: str | None, reason: str, requested_by: str | None = None) -> OperatorRequest:
    """A pending request with a fresh id; `requested_by` defaults to this user and host."""
    return OperatorRequest(
        id=f"req-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}",
        kind=kind,
        node=node,
        reason=reason,
        requested_by=requested_by or requester(),
        requested_at=time.time(),
    )


def submit(store: Store, job: str, kind: RequestKind, node: str | None, reason: str) -> OperatorRequest:
    """Write the request for the job's controller."""
    request = new_request(kind, node, reason)
    if not store.create(keys.request(job, request.id), request):
        raise CliError(f"request id {request.id} already exists in job {job!r}; try again")
    return request


def withdraw(store: Store, job: str, request_id: str) -> OperatorRequest | None:
    """Mark a still-pending request Failed (withdrawn); returns the record as it now stands."""
    key = keys.request(job, request_id)
    for _ in range(3):  # a controller may be writing it at this moment: re-read and decide again
        current, revision = store.get_with_revision(key, OperatorRequest)
        if current is None or current.status is not RequestStatus.PENDING:
            return current
        withdrawn = current.model_copy(
            update={"status": RequestStatus.FAILED, "message": WITHDRAWN, "finished_at": time.time()}
        )
        if store.commit({key: withdrawn}, expect_revision={key: revision}):
            return withdrawn
    return store.get(key, OperatorRequest)


def await_answer(store: Store, job: str, request: OperatorRequest, timeout: float) -> OperatorRequest | None:
    """Poll until the controller answers; after `timeout`, withdraw the request and return None (unless it
    answered just then). The CLI waits in the foreground, the console on a thread."""
    key = keys.request(job, request.id)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            current = store.get(key, OperatorRequest)
            if current is None:
                raise CliError(f"request {request.id} disappeared from etcd (was the job deleted?)")
            if current.status is not RequestStatus.PENDING:
                return current
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        withdraw(store, job, request.id)
        raise
    final = withdraw(store, job, request.id)
    if final is not None and final.status is not RequestStatus.PENDING and final.message != WITHDRAWN:
        return final  # it answered just as we gave up
    return None


def wait(store: Store, job: str, request: OperatorRequest, timeout: float) -> OperatorRequest:
    """await_answer with a spinner on stderr; a timeout is an error naming what to check."""
    what = f"{request.kind.value} {request.node or 'every node'} in {job}"
    with err.status(f"waiting for the controller to {what} (request {request.id}, up to {timeout:.0f}s)"):
        final = await_answer(store, job, request, timeout)
    if final is not None:
        return final
    raise CliError(
        f"the controller of {job!r} did not answer request {request.id} ({what}) within {timeout:.0f}s, so it was "
        "withdrawn; is the controller running? (stalwart status JOB; --timeout waits longer)",
        EXIT_TIMEOUT,
    )


def outcome_code(request: OperatorRequest) -> int:
    return 0 if request.status is RequestStatus.DONE else EXIT_FAILED


def report(final: OperatorRequest, output: OutputFormat) -> None:
    """Print the controller's answer; exit non-zero unless it was done."""
    if output is OutputFormat.JSON:
        print_json(final)
    else:
        out.print(request_view(final))
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
