"""Asking a job's controller to act (evict, cordon, uncordon, check) and waiting for its answer.

Nobody acts on a running job itself: two writers deciding about the same nodes would race. The CLI,
the console and the kubectl plugin write an OperatorRequest under the job's requests/ prefix; the
controller carries it out and writes the outcome (Done or Failed, a message, a result) into the same
record. The wait is bounded; when it runs out, the request is withdrawn with a compare-and-swap on
its revision, so a controller that comes back later does not evict a node the engineer has stopped
expecting to be evicted.
"""

from __future__ import annotations

import getpass
import socket
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from stalwart.ops.errors import EXIT_TIMEOUT, OpsError
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import OperatorRequest, RequestKind, RequestStatus

Waiting = Callable[[str], AbstractContextManager[Any]]
"""What a caller shows while a request waits, given what is awaited (the CLI: a spinner on stderr)."""


def quiet(_what: str) -> AbstractContextManager[Any]:
    """Wait without showing anything (the console, scripts)."""
    return nullcontext()


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
        raise OpsError(f"request id {request.id} already exists in job {job!r}; try again")
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
                raise OpsError(f"request {request.id} disappeared from etcd (was the job deleted?)")
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


def wait(store: Store, job: str, request: OperatorRequest, timeout: float, waiting: Waiting = quiet) -> OperatorRequest:
    """await_answer inside `waiting` (the CLI's spinner); a timeout is an error naming what to check."""
    what = f"{request.kind.value} {request.node or 'every node'} in {job}"
    with waiting(f"waiting for the controller to {what} (request {request.id}, up to {timeout:.0f}s)"):
        final = await_answer(store, job, request, timeout)
    if final is not None:
        return final
    raise OpsError(
        f"the controller of {job!r} did not answer request {request.id} ({what}) within {timeout:.0f}s, so it was "
        "withdrawn; is the controller running? (stalwart status JOB; --timeout waits longer)",
        EXIT_TIMEOUT,
    )
