"""A failure, through ByteRobust's ladder (policy.decide), into one decision with its incident.

The rung (evict, restart, roll back, fail, ignore), the budget it spends, the stop-time checks it
asks for and the incident that records it are all written in the same commit, so a controller
killed right after it neither loses the incident nor takes the rung twice.

The restart scope (below): what a recovery restarts in a multi-role job, the failed roles alone
(`restartScope: Role`) or the whole job. The roles that are not restarted get no command: their
workers keep their pids.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from stalwart.controller.core.decision import FenceNode, Plan
from stalwart.controller.core.detectors.base import Failure, View
from stalwart.controller.core.policy import Counters, count, decide
from stalwart.controller.core.progress import note_progress
from stalwart.controller.core.standbys import evict, new_node
from stalwart.controller.core.transitions import Trigger
from stalwart.spec import TrainingJobSpec
from stalwart.spec.model import FailureAction, FailureEvent, RecoveryMode, RestartScope
from stalwart.store import keys
from stalwart.store.records import Incident, JobState

NewId = Callable[[], str]  # a short random suffix that makes an incident id unique


def fail(plan: Plan, trigger: Trigger, reason: str, message: str, job: str, incident: Incident | None = None) -> None:
    state = plan.state
    state.reason, state.message = reason, message
    if incident is not None:
        plan.put(keys.incident(job, incident.id), incident)
    plan.enter(trigger)


def handle(plan: Plan, failure: Failure, view: View, job: str, new_id: NewId) -> None:
    """Take the policy's rung for `failure`, with its incident, in this decision."""
    state, spec, now = plan.state, view.spec, plan.now
    policy, ft = spec.failure_policy, spec.fault_tolerance
    what = failure.what
    decision = decide(
        what, policy, Counters(state.restarts, state.user_code_failures), checks_enabled=ft.stop_time_checks
    )
    workers = view.workers
    steps = [w.step for w in workers if w.step is not None]
    step_times = [w.step_time for w in workers if w.step_time]
    rank0 = next((w for w in workers if w.rank == 0), None)
    incident = Incident(
        id=f"inc-{state.generation:04d}-{new_id()}",
        job=job,
        failure_class=what.event,
        generation=state.generation,
        node=what.suspects[0] if what.suspects else None,
        rank=what.rank,
        exit_code=what.exit_code,
        evidence=what.evidence[:60],
        suspects=what.suspects,
        policy_action=decision.action,
        counted=decision.counted,
        verdict=what.verdict,
        runbook=what.runbook,
        failed_at=failure.failed_at,
        detected_at=failure.detected_at or now,
        diagnosed_at=what.diagnosed_at,
        step_at_failure=max(steps) if steps else None,
        loss_before=rank0.loss if rank0 and rank0.loss is not None and math.isfinite(rank0.loss) else None,
        mean_step_time=sum(step_times) / len(step_times) if step_times else None,
    )
    failure.incident = incident.id
    if incident.node is None and what.rank is not None:
        incident.node = view.owners.get(what.rank)
    failed_roles = roles_of(state, [*what.suspects, *([incident.node] if incident.node else [])])
    incident.role = failed_roles[0] if failed_roles else None
    for node, (lease, why) in failure.fence.items():
        plan.effect(FenceNode(node, lease, why))
    fields = {"incident": incident.id, "event": what.event.value, "action": decision.action.value}
    if decision.action is FailureAction.FAIL:
        incident.action = f"fail the job: {decision.reason}"
        message = decision.message
        if what.event is FailureEvent.USER_CODE_ERROR:
            tail = [ln for ln in what.evidence if ln.strip()][-12:]
            message = f"{decision.message}\n" + "\n".join(tail)
        note_progress(plan, workers, force=True)
        fail(plan, Trigger.FAILURE_FATAL, decision.reason or what.event.value, message, job, incident)
        plan.log("error", "job failed", reason=decision.reason, **fields)
        return
    if decision.action is FailureAction.IGNORE:
        incident.action = "ignored (failure policy)"
        incident.first_step_at = now
        plan.put(keys.incident(job, incident.id), incident)
        plan.log("warning", "failure ignored by policy", **fields)
        return
    actions = []
    if decision.action is FailureAction.EVICT:
        evict(plan, decision.suspects, incident, view.registrations, spec)
        actions.append("evict " + ", ".join(f"{s} (standby {r})" for s, r in incident.replacements.items()))
    if decision.action is FailureAction.ROLLBACK:
        # Skip the newest checkpoints: the fault may have been brewing before it surfaced. The newest
        # is the last interval boundary before the failure (or a later one a worker reported, if the
        # job saves off-interval).
        interval = spec.checkpoint.interval_steps
        newest = max(
            [(incident.step_at_failure or 0) // interval * interval, *(w.last_checkpoint_step or 0 for w in workers)]
        )
        state.resume_max_step = max(0, newest - policy.rollback_checkpoints * interval)
        actions.append(f"roll back to a checkpoint at or before step {state.resume_max_step}")
    if decision.stop_time_checks:
        actions.append("run stop-time checks")
    if policy.recovery is RecoveryMode.REQUEUE:
        # The baseline: every node relaunched from scratch (fresh agents, cold workers).
        state.slots = [new_node(state) for _ in state.slots]
        actions.append("requeue: relaunch every node")
    else:
        scoped = role_scope(failed_roles, spec)
        state.restarting_roles = scoped
        incident.scope = "Role" if scoped else "Job"
        where = f"the {', '.join(scoped)} role{'s' if len(scoped) > 1 else ''} only" if scoped else "every role"
        actions.append(
            f"restart the workers in place ({where})" if len(spec.roles) > 1 else "restart the workers in place"
        )
    incident.action = "; ".join(actions)
    counters = count(Counters(state.restarts, state.user_code_failures), decision)
    spent = counters.restarts - state.restarts
    state.restarts, state.user_code_failures = counters.restarts, counters.user_code_failures
    state.infra_restarts += 0 if decision.counted else 1
    for name in failed_roles or [spec.roles[0].name]:
        if (role := state.roles.get(name)) is not None:
            role.restarts += spent
            role.infra_restarts += 0 if decision.counted else 1
            role.incidents = [*role.incidents, incident.id]
    note_progress(plan, workers, force=True)
    state.open_incident = incident.id
    plan.put(keys.incident(job, incident.id), incident)
    plan.enter(Trigger.FAILURE_CHECKED if decision.stop_time_checks else Trigger.FAILURE_HANDLED)
    plan.log(
        "warning",
        "failure handled",
        suspects=what.suspects,
        action_taken=incident.action,
        exit_code=what.exit_code,
        **fields,
    )


# -- what a recovery restarts ----------------------------------------------------------------------------


def roles_of(state: JobState, nodes: list[str]) -> list[str]:
    """The roles whose slots `nodes` hold, in the job's order."""
    found = {r for n in nodes if (r := state.role_of(n)) is not None}
    return [r for r in state.roles if r in found]


def role_scope(failed: list[str], spec: TrainingJobSpec) -> list[str]:
    """The roles a recovery restarts alone, or [] for the whole job: a multi-role job's failure stays
    in its roles when each of them says `restartScope: Role`; one no role owns is the job's."""
    if len(spec.roles) < 2 or not failed:
        return []
    scopes = {r.name: r.restart_scope for r in spec.roles}
    return failed if all(scopes.get(r) is RestartScope.ROLE for r in failed) else []
