"""The dual-phase replay stages: launch the phase's groups as one generation, judge each group from
the heartbeats, then the vertical phase, then read the faulty node off the failing groups."""

from __future__ import annotations

from stalwart.controller.decision import Needs, Plan
from stalwart.controller.eviction import evict
from stalwart.controller.observation import Observation
from stalwart.controller.replay_run import conclusion, judge, phase_assignment
from stalwart.controller.transitions import Trigger
from stalwart.store import keys
from stalwart.store.records import JobStage


def launch_phase(plan: Plan, obs: Observation, job: str) -> Needs | None:
    """Run the current phase's groups still to judge, each a small copy of the job (of the
    replayed role), as one generation (each group its own rendezvous and world size)."""
    state, spec = plan.state, obs.spec.spec
    replay = state.replay
    assert replay is not None, "a replay stage without a replay plan"
    pending = [g for g in replay.groups(state.stage) if g.outcome is None]
    missing = frozenset(g.nodes[0] for g in pending) - set(obs.rendezvous)
    if missing:
        return Needs(rendezvous=missing)
    generation = state.generation + 1
    if replay.role is not None:
        # The other roles keep running the generation they run: pin it before the job's moves on.
        replaying = {n for g in pending for n in g.nodes}
        state.node_generations = {n: generation if n in replaying else state.running_generation(n) for n in state.slots}
    assignment = phase_assignment(job, spec, pending, generation, lambda node: obs.rendezvous[node], replay.role)
    assignment.replay_steps = spec.failure_policy.replay_steps
    plan.put(keys.generation(job, generation), assignment)
    state.generation = generation
    replay.generation, replay.started_at = generation, plan.now
    plan.log(
        "info",
        "replay phase started",
        replay_phase=state.stage.value,
        generation=generation,
        groups={g.id: g.nodes for g in pending},
        **({"role": replay.role} if replay.role else {}),
    )
    return None


def judge_phase(plan: Plan, obs: Observation, job: str) -> None:
    """Judge the running groups; when every group of the phase is judged, go on to the vertical
    phase, or evict the node in both failing groups (a standby steps in) and restart."""
    state, spec = plan.state, obs.spec.spec
    replay = state.replay
    assert replay is not None and replay.generation is not None
    procs = next(r for r in spec.roles if replay.role in (None, r.name)).processes_per_node
    for group in replay.groups(state.stage):
        if group.outcome is not None:
            continue
        verdict = judge(
            group,
            obs.beats,
            set(obs.registrations),
            replay.generation,
            procs,
            replay.started_at or plan.now,
            spec.fault_tolerance.first_step_timeout_seconds,
            plan.now,
        )
        if verdict is not None:
            group.outcome, group.reason = verdict  # type: ignore[assignment]
            plan.log(
                "info", "replay group judged", group=group.id, nodes=group.nodes, outcome=verdict[0], why=verdict[1]
            )
    if any(g.outcome is None for g in replay.groups(state.stage)):
        return
    replay.generation = None  # what is left of this phase's workers is stopped before the next
    if state.stage is JobStage.REPLAY_HORIZONTAL:
        plan.enter(Trigger.HORIZONTAL_JUDGED)
        return
    node, summary = conclusion(replay)
    state.replay, state.unexplained_failures = None, 0
    if replay.role is not None:
        state.roles[replay.role].unexplained_failures = 0
    incident = obs.incident.model_copy(deep=True) if obs.incident is not None else None
    if incident is not None:
        incident.evidence += [summary] + [
            f"{g.id} {g.nodes}: {g.outcome}, {g.reason}" for g in [*replay.horizontal, *replay.vertical]
        ]
        if node is not None:
            incident.suspects = sorted(set(incident.suspects) | {node})
            evict(plan, [node], incident, obs.registrations, spec)
            incident.action += f"; dual-phase replay found {node}, evicted"
        else:
            incident.action += "; dual-phase replay inconclusive, restarting"
        plan.put(keys.incident(job, incident.id), incident)
    plan.enter(Trigger.REPLAY_CONCLUDED)
    plan.log("warning", "replay done", found=node, summary=summary)
