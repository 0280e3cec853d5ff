"""The console's actions, each recorded in the job's audit trail in the same etcd transaction.

Node actions (evict, cordon, uncordon, run the checks) are OperatorRequests, as the CLI makes them:
the job's controller owns its nodes and carries them out. A thread waits for the answer and withdraws
the request if none comes in time, as the CLI does. Suspend and resume set the job's `spec.suspend`:
on a console that serves a Kubernetes cluster (ConsoleConfig.kubernetes, `stalwart console
--kubernetes`), on the TrainingJob itself through the Kubernetes API (the plugin the CLI uses,
stalwart.ops.actions), so that the operator's next reconcile keeps it; elsewhere (a `stalwart run`
job) in etcd's copy of the spec, which that job's controller honours.
"""

from __future__ import annotations

import threading
import time
import uuid
from enum import Enum

from stalwart.console.access import Identity
from stalwart.logs import get_logger
from stalwart.ops import requests
from stalwart.ops.actions import kubernetes_patcher, training_job
from stalwart.ops.lookup import job_for_node, require_state
from stalwart.ops.spec_edit import SpecEditError, set_suspend
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import AuditEntry, JobPhase, JobStage, JobState, OperatorRequest, RequestKind

log = get_logger("stalwart.console.actions")

MAX_REASON = 500


class Action(str, Enum):
    EVICT = "evict"
    CORDON = "cordon"
    UNCORDON = "uncordon"
    CHECK = "check"
    SUSPEND = "suspend"
    RESUME = "resume"

    @property
    def request_kind(self) -> RequestKind | None:
        return {
            Action.EVICT: RequestKind.EVICT,
            Action.CORDON: RequestKind.CORDON,
            Action.UNCORDON: RequestKind.UNCORDON,
            Action.CHECK: RequestKind.CHECK,
        }.get(self)

    @property
    def needs_node(self) -> bool:
        return self in (Action.EVICT, Action.CORDON, Action.UNCORDON)


# How long the controller has to answer before the request is withdrawn (the CLI's defaults).
ANSWER_SECONDS = {Action.EVICT: 120.0, Action.CORDON: 60.0, Action.UNCORDON: 60.0, Action.CHECK: 600.0}

CONSEQUENCES = {
    Action.EVICT: "Its workers stop, a standby takes its ranks and the job restarts from its last checkpoint; "
    "the machine is cordoned.",
    Action.CORDON: "No job will place work on the machine until it is uncordoned; it keeps its ranks until evicted.",
    Action.UNCORDON: "Jobs may place work on the machine again (after its pre-flight checks).",
    Action.CHECK: "The controller runs the collective and compute checks now; failures are reported, not evicted.",
    Action.SUSPEND: "The job's workers stop and its state is kept; resume starts it again from its last checkpoint.",
    Action.RESUME: "The job starts again from its last checkpoint.",
}


class Conflict(Exception):
    """The action does not apply to the job as it is now (finished, not suspended...): a 409."""


class BadForm(ValueError):
    """A form field is wrong: a 400 naming the field."""


def check_reason(reason: str) -> str:
    text = " ".join(reason.split())
    if not text:
        raise BadForm("reason: say why (it goes in the audit trail)")
    if len(text) > MAX_REASON:
        raise BadForm(f"reason: at most {MAX_REASON} characters")
    return text


def check_target(store: Store, job: str, action: Action, node: str | None) -> JobState:
    """The job as it is now, if the action applies to it: NotFound for an unknown job or node."""
    state = require_state(store, job)
    if state.phase.terminal:
        raise Conflict(f"job {job!r} already finished ({state.phase.value}): there is nothing to {action.value}")
    if state.stage is JobStage.SAVING and action in (Action.EVICT, Action.CHECK):
        raise Conflict(
            f"job {job!r} is suspending: it saves a checkpoint, then its nodes stop; there is nothing to {action.value}"
        )
    if state.phase is JobPhase.SUSPENDED and action in (Action.EVICT, Action.CHECK):
        raise Conflict(f"job {job!r} is suspended: its nodes are stopped, there is nothing to {action.value}")
    if action.needs_node and not node:
        raise BadForm(f"node: {action.value} needs a node of job {job!r}")
    if node:
        job_for_node(store, node, job)  # NotFound when the node is not the job's
    return state


def perform(
    store: Store, job: str, action: Action, node: str | None, reason: str, who: Identity, kubernetes: bool = False
) -> AuditEntry:
    """Carry out the action and audit it; `kubernetes`: suspend and resume go through the TrainingJob."""
    reason = check_reason(reason)
    check_target(store, job, action, node)
    entry = AuditEntry(
        id=f"audit-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}",
        job=job,
        action=action.value,
        node=node or None,
        reason=reason,
        actor=who.user,
        via=who.via,
        at=time.time(),
    )
    kind = action.request_kind
    if kind is not None:
        _request(store, job, kind, action, entry, who)
    elif kubernetes and training_job(job) is not None:
        _patch_training_job(store, job, action is Action.SUSPEND, entry)
    else:
        _set_suspend(store, job, action is Action.SUSPEND, entry)
    log.info(
        "console action",
        fields={"job": job, "action": action.value, "node": node, "actor": who.user, "audit": entry.id},
    )
    return entry


def _request(store: Store, job: str, kind: RequestKind, action: Action, entry: AuditEntry, who: Identity) -> None:
    request = requests.new_request(kind, entry.node, entry.reason, requested_by=f"{who.user} (console)")
    entry.request_id = request.id
    request_key = keys.request(job, request.id)
    # Both or neither: an action nobody can trace, or a trace of an action never asked, would mislead.
    if not store.commit(
        {request_key: request, keys.audit_entry(job, entry.id): entry}, expect_revision={request_key: 0}
    ):
        raise Conflict(f"request id {request.id} already exists in job {job!r}; try again")
    threading.Thread(
        target=_await, args=(store, job, request, ANSWER_SECONDS[action]), name=f"await-{request.id}", daemon=True
    ).start()


def _await(store: Store, job: str, request: OperatorRequest, timeout: float) -> None:
    try:
        final = requests.await_answer(store, job, request, timeout)
    except Exception as exc:  # etcd gone, job deleted: the request record says what happened, if anything
        log.warning("request not followed", fields={"job": job, "request": request.id, "error": str(exc)})
        return
    log.info(
        "request answered" if final else "request withdrawn: no answer in time",
        fields={"job": job, "request": request.id, "status": final.status.value if final else "Failed"},
    )


def _set_suspend(store: Store, job: str, suspend: bool, entry: AuditEntry) -> None:
    try:
        changed = set_suspend(store, job, suspend, also={keys.audit_entry(job, entry.id): entry})
    except SpecEditError as exc:
        raise Conflict(str(exc)) from None
    if not changed:
        raise Conflict(f"job {job!r} is {'already' if suspend else 'not'} suspended")


def _patch_training_job(store: Store, job: str, suspend: bool, entry: AuditEntry) -> None:
    """spec.suspend on the TrainingJob (the operator writes it into etcd's spec and the controller
    follows), then the audit entry; the Kubernetes audit log names the console's service account,
    the entry names the person."""
    target = training_job(job)
    assert target is not None
    namespace, name = target
    if not kubernetes_patcher(namespace).request_suspend(name, suspend):
        raise Conflict(f"TrainingJob {namespace}/{name} is {'already' if suspend else 'not'} suspended")
    store.put(keys.audit_entry(job, entry.id), entry)
