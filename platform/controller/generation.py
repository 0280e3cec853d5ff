"""Starting a generation: ranks and rendezvous for the slot nodes, written with the state."""

from __future__ import annotations

from stalwart.controller.decision import Needs, Plan
from stalwart.controller.observation import Observation
from stalwart.controller.ranks import assign
from stalwart.controller.transitions import Trigger
from stalwart.store import keys


def start_generation(plan: Plan, obs: Observation, trigger: Trigger, job: str) -> Needs | None:
    """Generation + 1 on the current slots (a replacement sits in its predecessor's slot, so it
    inherits its ranks). The spec's codeVersion is adopted here: that is when a lazy code update
    lands. Needs rank 0's rendezvous address first."""
    state = plan.state
    rendezvous = obs.rendezvous.get(state.slots[0])
    if rendezvous is None:
        return Needs(rendezvous=frozenset({state.slots[0]}))
    spec = obs.spec.spec
    if spec.code_version != state.code_version:
        plan.log("info", "code update applied", previous=state.code_version, code_version=spec.code_version)
    state.code_version, state.code_update_seen_at = spec.code_version, None
    generation = state.generation + 1
    assignment = assign(job, spec, state.slots, generation, rendezvous)
    assignment.resume_max_step = state.resume_max_step
    assignment.code_version = state.code_version
    plan.put(keys.generation(job, generation), assignment)
    if state.open_incident is not None and obs.incident is not None:
        incident = obs.incident.model_copy(deep=True)
        incident.restarted_at = plan.now
        plan.put(keys.incident(job, incident.id), incident)
    state.generation = generation
    state.started_at = state.started_at or plan.now
    state.generation_started_at = plan.now
    plan.enter(trigger)
    plan.log(
        "info",
        "generation started",
        generation=generation,
        slots=state.slots,
        standbys=state.standbys,
        master=f"{assignment.master_addr}:{assignment.master_port}",
    )
    return None
