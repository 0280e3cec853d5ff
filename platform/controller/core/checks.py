"""Node checks the stages wait for: pre-flight before the start, stop-time checks after a failure
with no machine named. Both run off the loop (work.NodeChecks); these functions read their results
into the decision: evictions, incidents, and the next stage.
"""

from __future__ import annotations

from stalwart.controller.core.decision import Needs, Plan
from stalwart.controller.core.generation import start_generation
from stalwart.controller.core.ladder import NewId, fail
from stalwart.controller.core.observation import Observation
from stalwart.controller.core.replay import plan_phases, replayable
from stalwart.controller.core.standbys import evict
from stalwart.controller.core.transitions import Trigger
from stalwart.controller.core.work import NodeChecks, WorkResult, check_procs
from stalwart.spec import TrainingJobSpec
from stalwart.spec.model import FailureAction
from stalwart.store import keys
from stalwart.store.records import FailureClass, Incident, JobStage, JobState, RoleState

MAX_PREFLIGHT_ROUNDS = 3
REPLAY_RECENT_SECONDS = 3600.0  # failures further apart than this do not add up towards a replay


def preflight_checks(plan: Plan, obs: Observation) -> NodeChecks:
    """This round's pre-flight: the slot nodes and the standbys that registered."""
    state = plan.state
    standbys = [s for s in state.standbys if s in obs.registrations]
    return NodeChecks(
        "preflight", str(state.preflight_rounds + 1), (*state.slots, *standbys), check_procs(obs.spec.spec)
    )


def stop_time_checks(plan: Plan, obs: Observation) -> NodeChecks:
    """The nodes the recovery restarts (a role-scoped one: its roles' alone; the others keep running)."""
    state = plan.state
    return NodeChecks("stop-time", str(state.generation), tuple(state.restarting_slots()), check_procs(obs.spec.spec))


def on_preflight(plan: Plan, obs: Observation, result: WorkResult, job: str, new_id: NewId) -> Needs | None:
    """Evict the nodes that failed (infrastructure's fault: no restart counted); start when every
    slot node passed, else check again once the replacements registered, at most
    MAX_PREFLIGHT_ROUNDS times."""
    state, spec, now = plan.state, obs.spec.spec, plan.now
    state.preflight_rounds += 1
    rounds = state.preflight_rounds
    if result.error is not None:
        plan.log("error", "pre-flight checks could not run", error=result.error, round=rounds)
        if rounds >= MAX_PREFLIGHT_ROUNDS:
            fail(
                plan,
                Trigger.PREFLIGHT_EXHAUSTED,
                "PreflightFailed",
                f"pre-flight checks could not run: {result.error}",
                job,
            )
        return None  # still pre-flight: the next tick runs another round
    failed = [v for v in result.verdicts if not v.passed]
    bad = {v.node for v in failed}
    checked = {v.node for v in result.verdicts if v.passed and v.node in state.standbys}
    state.standbys_checked = sorted(set(state.standbys_checked) | checked)
    for v in failed:
        incident = Incident(
            id=f"inc-pre{rounds}-{new_id()}",
            job=job,
            failure_class=FailureClass.PREFLIGHT_FAILED,
            generation=0,
            node=v.node,
            suspects=[v.node],
            evidence=v.reasons[:20],
            counted=False,
            policy_action=FailureAction.EVICT,
            runbook="preflight_failed",
            failed_at=now,
            detected_at=now,
        )
        evict(plan, [v.node], incident, obs.registrations, spec, exclude=bad)
        incident.action = f"evict {v.node} before the start" + (
            f", replace with {incident.replacements[v.node]}" if v.node in incident.replacements else ""
        )
        plan.put(keys.incident(job, incident.id), incident)
        plan.log("warning", "pre-flight failed; evicting", node=v.node, reasons=v.reasons[:3])
    passed = {v.node for v in result.verdicts if v.passed}
    if all(s in passed for s in state.slots):
        return start_generation(plan, obs, Trigger.GENERATION_STARTED, job)
    if rounds >= MAX_PREFLIGHT_ROUNDS:
        fail(
            plan,
            Trigger.PREFLIGHT_EXHAUSTED,
            "PreflightFailed",
            f"nodes kept failing pre-flight checks after {rounds} rounds",
            job,
        )
    else:
        plan.enter(Trigger.PREFLIGHT_RETRY)
    return None


def on_stop_time_checks(plan: Plan, obs: Observation, result: WorkResult, job: str) -> None:
    """Evict what failed (standbys step in); if all passed the fault was transient, and one more
    unexplained failure counts towards a dual-phase replay."""
    state = plan.state
    failed = [v for v in result.verdicts if not v.passed] if result.error is None else []
    unexplained = _count_unexplained(plan, obs.spec.spec, explained=bool(failed))
    incident = obs.incident.model_copy(deep=True) if obs.incident is not None else None
    if incident is not None:
        if result.error is not None:
            incident.evidence.append(f"stop-time checks could not run: {result.error}"[:500])
        if failed:
            incident.evidence += [f"stop-time check failed on {v.node}: {'; '.join(v.reasons[:3])}" for v in failed]
            incident.suspects = sorted(set(incident.suspects) | {v.node for v in failed})
            evict(plan, [v.node for v in failed], incident, obs.registrations, obs.spec.spec)
            incident.action += f"; stop-time checks evicted {', '.join(v.node for v in failed)}"
        elif result.error is None:  # the record of what ran, and what it counts for
            replay_after = obs.spec.spec.failure_policy.replay_after
            incident.evidence.append(
                f"stop-time checks passed on {', '.join(v.node for v in result.verdicts) or 'no node'}: "
                f"unexplained failure {unexplained}"
                + (f" of the {replay_after} that start a dual-phase replay" if replay_after else "")
            )
        plan.put(keys.incident(job, incident.id), incident)
    plan.log("info", "stop-time checks done", failed=[v.node for v in failed], error=result.error)
    if state.replay is None:
        plan.enter(Trigger.CHECKS_DONE)
    elif all(g.outcome is not None for g in state.replay.groups(JobStage.REPLAY_HORIZONTAL)):
        plan.enter(Trigger.REPLAY_VERTICAL_DUE)
    else:
        plan.enter(Trigger.REPLAY_HORIZONTAL_DUE)


def _count_unexplained(plan: Plan, spec: TrainingJobSpec, explained: bool) -> int:
    """A failure the checks cannot explain counts towards a replay; one that recurs within the hour
    counts on top of the last (a job that ran well for longer starts the count again). A multi-role
    job's failure that stays in one role counts in that role's books, and replays that role alone."""
    state, policy = plan.state, spec.failure_policy
    role = state.restarting_roles[0] if len(spec.roles) > 1 and len(state.restarting_roles) == 1 else None
    books: JobState | RoleState = state.roles[role] if role is not None else state
    if explained:
        books.unexplained_failures = 0
        return 0
    ran = plan.now - (books.generation_started_at or plan.now)
    books.unexplained_failures = 1 if ran > REPLAY_RECENT_SECONDS else books.unexplained_failures + 1
    if not policy.replay_after or books.unexplained_failures < policy.replay_after:
        return books.unexplained_failures
    why_not = replayable(spec, state.slots, role)
    if why_not:
        plan.log("warning", "failures keep coming with nothing to blame, and the job cannot be replayed", why=why_not)
        return books.unexplained_failures
    state.replay = plan_phases(spec, state.slots, role)
    plan.log(
        "warning",
        "failures keep coming with nothing to blame; dual-phase replay",
        failures=books.unexplained_failures,
        vertical=[g.nodes for g in state.replay.vertical],
        **({"role": role} if role else {}),
    )
    return books.unexplained_failures
