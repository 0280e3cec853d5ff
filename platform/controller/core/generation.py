"""Starting a generation: ranks and rendezvous for the slot nodes, written with the state.

In a multi-role job each role is its own world with its own rendezvous and generation counter. A
role-scoped recovery (`state.restarting_roles`) starts only those roles again: the job's generation
still numbers the new assignment, but the other roles' nodes keep running the one they run, with
their rendezvous and ranks unchanged, and get no command.
"""

from __future__ import annotations

from stalwart.controller.core.decision import Needs, Plan
from stalwart.controller.core.observation import Observation
from stalwart.controller.core.ranks import RoleWorld, assign, role_states
from stalwart.controller.core.transitions import Trigger
from stalwart.store import keys


def start_generation(plan: Plan, obs: Observation, trigger: Trigger, job: str) -> Needs | None:
    """Generation + 1 on the current slots (a replacement sits in its predecessor's slot, so it
    inherits its ranks). The spec's codeVersion is adopted here: that is when a lazy code update
    lands. Needs the rendezvous address of rank 0 (of each restarting role's rank 0) first."""
    state = plan.state
    spec = obs.spec.spec
    if not state.roles:
        state.roles = role_states(spec)  # a state written before roles had records
    multi = len(spec.roles) > 1
    restarting = [r for r in state.roles if not state.restarting_roles or r in state.restarting_roles]
    hosts = [state.role_slots(r)[0] for r in restarting] if multi else [state.slots[0]]
    if not set(hosts) <= set(obs.rendezvous):
        return Needs(rendezvous=frozenset(hosts))
    if spec.code_version != state.code_version:
        plan.log("info", "code update applied", previous=state.code_version, code_version=spec.code_version)
    state.code_version, state.code_update_seen_at = spec.code_version, None
    generation = state.generation + 1
    state.died_before_joining = 0
    restarting_slots = set(state.restarting_slots())
    if state.restarting_roles:
        state.node_generations = {
            n: generation if n in restarting_slots else state.running_generation(n) for n in state.slots
        }
    else:
        state.node_generations = {}
    for name in restarting:
        role = state.roles[name]
        role.restarted += 1 if role.generation else 0
        role.generation += 1
        role.assigned_in = generation
        role.generation_started_at = plan.now
        if multi:
            role.master_addr, role.master_port = obs.rendezvous[state.role_slots(name)[0]]
    worlds = None
    if multi:
        worlds = {
            r.name: RoleWorld(r.master_addr or "127.0.0.1", r.master_port or 0, r.generation)
            for r in state.roles.values()
        }
        first = worlds[spec.roles[0].name]
        rendezvous = (first.master_addr, first.master_port)
    else:
        rendezvous = obs.rendezvous[state.slots[0]]
    memory = {n: f"{r.address}:{r.memory_port}" for n, r in obs.registrations.items() if r.memory_port}
    assignment = assign(job, spec, state.slots, generation, rendezvous, worlds, memory, created_at=plan.now)
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
    scope = {"roles": restarting} if state.restarting_roles else {}
    state.restarting_roles = []
    plan.enter(trigger)
    plan.log(
        "info",
        "generation started",
        generation=generation,
        slots=state.slots,
        standbys=state.standbys,
        master=f"{assignment.master_addr}:{assignment.master_port}",
        **scope,
    )
    return None
