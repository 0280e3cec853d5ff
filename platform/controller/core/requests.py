"""Carrying out operator requests (evict, cordon, uncordon, check), one at a time, oldest first.

Each request's outcome is written into the request itself, guarded by the revision it was read at:
a request withdrawn meanwhile is left alone. A check runs off the loop; the request stays pending
until its result is in.
"""

from __future__ import annotations

from stalwart.controller.core.decision import Launch, Plan, UncordonNode
from stalwart.controller.core.detectors.base import RequestFinding, View
from stalwart.controller.core.ladder import NewId, role_scope, roles_of
from stalwart.controller.core.standbys import evict, top_up_standbys
from stalwart.controller.core.transitions import Trigger
from stalwart.controller.core.work import NodeChecks, check_procs
from stalwart.spec.model import FailureAction, FailureEvent
from stalwart.store import keys
from stalwart.store.records import Cordon, Incident, JobStage, OperatorRequest, RequestKind, RequestStatus


def carry_out(plan: Plan, found: RequestFinding, view: View, job: str, new_id: NewId) -> bool:
    """Act on the request; True if this decision writes its outcome (then nothing else is decided)."""
    state, now = plan.state, plan.now
    request = found.request.model_copy(deep=True)
    known = set(state.slots) | set(state.standbys)
    names_a_node = request.kind is not RequestKind.CHECK or request.node is not None
    node = request.node
    if names_a_node and (node is None or (node not in known and request.kind is not RequestKind.UNCORDON)):
        request.status = RequestStatus.FAILED
        request.message = (
            f"node {node!r} is not part of job {job} "
            f"(nodes: {', '.join(state.slots)}; standbys: {', '.join(state.standbys) or 'none'})"
        )
    elif request.kind is RequestKind.EVICT and node is not None:
        if state.stage is not JobStage.RUNNING and node in state.slots:
            return False  # evict between recoveries, not in the middle of one
        _evict(plan, request, node, view, job, new_id)
    elif request.kind is RequestKind.CORDON and node is not None:
        plan.put(
            keys.cordon(node),
            Cordon(
                node=node,
                reason=request.reason or "cordoned by hand",
                cordoned_at=now,
                by=request.requested_by or "cli",
            ),
        )
        if node in state.standbys:
            state.standbys.remove(node)
            state.evicted.append(node)
            top_up_standbys(state, view.spec)
        request.status = RequestStatus.DONE
        request.message = f"{node} cordoned" + (
            "; it keeps running its ranks until evicted" if node in state.slots else ""
        )
    elif request.kind is RequestKind.UNCORDON and node is not None:
        plan.deletes.append(keys.cordon(node))
        plan.effect(UncordonNode(node))
        request.status, request.message = RequestStatus.DONE, f"{node} uncordoned"
    elif request.kind is RequestKind.CHECK and not _checked(plan, request, view):
        return False
    request.finished_at = now
    plan.put(keys.request(job, request.id), request)
    plan.guards[keys.request(job, request.id)] = found.revision
    plan.log("info", "request done", request=request.id, kind=request.kind.value, status=request.status.value)
    return True


def _evict(plan: Plan, request: OperatorRequest, node: str, view: View, job: str, new_id: NewId) -> None:
    state, now = plan.state, plan.now
    incident = Incident(
        id=f"inc-{state.generation:04d}-{new_id()}",
        job=job,
        failure_class=FailureEvent.MACHINE_FAULT,
        generation=state.generation,
        node=node,
        suspects=[node],
        evidence=[f"evicted by {request.requested_by or 'an operator'}: {request.reason}"],
        policy_action=FailureAction.EVICT,
        counted=False,
        runbook="machine_fault",
        failed_at=now,
        detected_at=now,
    )
    failed = roles_of(state, [node])
    incident.role = failed[0] if failed else None
    evict(plan, [node], incident, view.registrations, view.spec)
    incident.action = f"evict {node} on request" + (
        f", standby {incident.replacements[node]} takes its ranks" if node in incident.replacements else ""
    )
    if node in incident.replacements:
        state.restarting_roles = role_scope(failed, view.spec)
        incident.scope = "Role" if state.restarting_roles else "Job"
        state.open_incident = incident.id
        state.infra_restarts += 1
        for name in failed:
            state.roles[name].infra_restarts += 1
            state.roles[name].incidents = [*state.roles[name].incidents, incident.id]
        plan.enter(Trigger.EVICT_REQUESTED)
    else:
        incident.first_step_at = now  # a standby left the pool: no downtime
    plan.put(keys.incident(job, incident.id), incident)
    request.status, request.message = RequestStatus.DONE, incident.action
    request.result = {"incident": incident.id, "replacements": incident.replacements}


def _checked(plan: Plan, request: OperatorRequest, view: View) -> bool:
    """The check's outcome into the request once its result is in (True), else launch it."""
    nodes = (request.node,) if request.node else tuple(plan.state.slots)
    work = NodeChecks("request", request.id, nodes, check_procs(view.spec))
    result = view.result(work.key)
    if result is None:
        if not view.busy(work.key):
            plan.effect(Launch(work))
        return False
    if result.error is not None:
        request.status, request.message = RequestStatus.FAILED, f"the checks could not run: {result.error}"
        return True
    failed = [v.node for v in result.verdicts if not v.passed]
    request.status = RequestStatus.DONE
    request.message = f"{len(nodes) - len(failed)}/{len(nodes)} nodes passed" + (
        f"; failed: {', '.join(failed)}" if failed else ""
    )
    request.result = {v.node: {"passed": v.passed, "reasons": v.reasons[:10]} for v in result.verdicts}
    return True
