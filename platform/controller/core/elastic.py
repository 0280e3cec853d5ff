"""Elastic data parallelism: a role with minReplicas below replicas shrinks when a lost node cannot be
replaced, and grows back at a checkpoint boundary when capacity returns.

The state says each role's size (RoleState.nodes); `sized` gives every branch of the core the spec
at that size, so ranks, detectors, replay and the success check all see the job as it runs. The
declared spec (Observation.declared) keeps the size to grow back to.

Shrink (Restarting): a slot node is missing, the cluster did not place it (no live node of that
name, or a Pending pod the scheduler could not place) and says no machine is free. Its elastic role
drops to the largest valid size its remaining nodes allow (stalwart.spec.elastic: other parallel
dimensions kept, so a node holding a TP or PP group member takes its whole group out); nodes beyond
that size wait as the role's standbys, and the missing ones stay asked for as standbys too, started
when a machine frees (a Pending pod on Kubernetes). The open incident records the resize; the
restart goes on with the nodes kept, from the last committed checkpoint, resharded on load, the
loader continuing at the next sample.

Grow (Running): the role runs below replicas, enough of its standbys registered (and passed their
check, with pre-flight on) for a larger valid size, and a checkpoint was just committed (this tick
added it to the catalog): they take slots at the role's end, an ElasticGrow incident records the
resize, and the next generation starts at the larger size from that checkpoint. The controller does
not wait for the next periodic save: once a larger size fits, it asks the workers to checkpoint at
a step just ahead (a CheckpointRequest, as a suspension does; once per generation). A script that
does not read requests (worker_sdk.checkpoint_requested) grows at its next periodic save.

A role restarting alone (restartScope: Role) does not shrink: its peers' ranks would move under
their running workers.
"""

from __future__ import annotations

from stalwart.controller.core.catalog import added_steps
from stalwart.controller.core.decision import Plan
from stalwart.controller.core.detectors.base import View
from stalwart.controller.core.ladder import NewId
from stalwart.controller.core.observation import Observation
from stalwart.controller.core.progress import note_progress
from stalwart.controller.core.suspension import save_step
from stalwart.controller.core.transitions import Trigger
from stalwart.spec import TrainingJob, TrainingJobSpec
from stalwart.spec.elastic import elastic, grown_size, resized, shrunk_size
from stalwart.spec.model import FailureAction, FailureEvent
from stalwart.store import keys
from stalwart.store.records import CheckpointRequest, Incident, JobState, Resize


def sized(job: TrainingJob, state: JobState) -> TrainingJob:
    """The job's spec at the size its state runs each role."""
    spec = resized(job.spec, {name: r.nodes for name, r in state.roles.items()})
    return job if spec is job.spec else job.model_copy(update={"spec": spec})


def shortfall(state: JobState, spec: TrainingJobSpec) -> dict[str, int]:
    """Role -> the nodes it runs below its declared replicas (roles at full size left out)."""
    return {
        r.name: r.replicas - state.roles[r.name].nodes
        for r in spec.roles
        if r.name in state.roles and state.roles[r.name].nodes < r.replicas
    }


def relayout(state: JobState, spec: TrainingJobSpec) -> None:
    """Each role's first slot, first rank and world size again from its node count, roles in spec
    order (as `ranks.assign` numbers them)."""
    slot = rank = 0
    for role in spec.roles:
        record = state.roles[role.name]
        record.first_slot, record.first_rank = slot, rank
        record.world_size = record.nodes * role.processes_per_node
        slot += record.nodes
        rank += record.world_size


def _capacity(state: JobState, spec: TrainingJobSpec) -> float:
    declared = sum(r.replicas * r.processes_per_node for r in spec.roles)
    running = sum(state.roles[r.name].nodes * r.processes_per_node for r in spec.roles if r.name in state.roles)
    return running / declared if declared else 1.0


def _resize(role: str, before: int, after: int, replicas: int, at: float) -> Resize:
    """The resize, its job-wide capacity filled in once every role's new size is known."""
    return Resize(role=role, from_replicas=before, to_replicas=after, replicas=replicas, capacity=0.0, at=at)


def checkpoint_committed(plan: Plan, obs: Observation) -> bool:
    """This decision adds a checkpoint newer than any in the catalog: a checkpoint boundary."""
    newest = max(obs.catalog, default=-1)
    return any(step > newest for step in added_steps(plan))


def _set_role_slots(state: JobState, spec: TrainingJobSpec, role: str, slots: list[str]) -> None:
    """The role's slots replaced by `slots`; every role's place laid out again (the roles after it move)."""
    record = state.roles[role]
    state.slots = [*state.slots[: record.first_slot], *slots, *state.slots[record.first_slot + record.nodes :]]
    record.nodes = len(slots)
    relayout(state, spec)


def _to_pool(state: JobState, nodes: list[str], role: str) -> None:
    for node in nodes:
        if node not in state.standbys:
            state.standbys.append(node)
        state.standby_roles[node] = role


def shrink(plan: Plan, obs: Observation, job: str) -> bool:
    """Shrink the elastic roles whose missing slot nodes no machine can take (module docstring).
    True if a role shrank (the decision then commits the smaller layout and nothing else)."""
    state, declared = plan.state, obs.declared_spec.spec
    if obs.cluster is None or obs.free_machines is None or obs.free_machines > 0 or state.restarting_roles:
        return False
    cluster = obs.cluster
    unplaced = {
        s
        for s in state.slots
        if s not in obs.registrations and (s not in cluster or not cluster[s].alive or cluster[s].unschedulable)
    }
    if not unplaced or not state.roles:
        return False
    resizes: list[Resize] = []
    for role in declared.roles:
        if not elastic(role) or role.name not in state.roles:
            continue
        slots = state.role_slots(role.name)
        gone = [s for s in slots if s in unplaced]
        if not gone:
            continue
        size = shrunk_size(declared, role, len(slots) - len(gone))
        if size is None:
            plan.log("warning", "cannot shrink below minReplicas: the restart waits", role=role.name, missing=gone)
            continue
        kept = [s for s in slots if s not in gone][:size]
        leaving = [s for s in slots if s not in kept]
        _set_role_slots(state, declared, role.name, kept)
        _to_pool(state, leaving, role.name)  # asked for again, or waiting: capacity to grow back with
        resizes.append(_resize(role.name, len(slots), size, role.replicas, plan.now))
    if not resizes:
        return False
    capacity = _capacity(state, declared)
    resizes = [r.model_copy(update={"capacity": capacity}) for r in resizes]
    state.resizes = [*state.resizes, *resizes]
    if obs.incident is not None:
        incident = obs.incident.model_copy(deep=True)
        incident.resize = resizes[0]
        incident.action = "; ".join(
            [incident.action, *(f"shrink {r.role} from {r.from_replicas} to {r.to_replicas} nodes" for r in resizes)]
        )
        plan.put(keys.incident(job, incident.id), incident)
    plan.enter(Trigger.SHRUNK)
    for r in resizes:
        plan.log(
            "warning",
            "no standby left and no machine free: data parallelism shrinks",
            role=r.role,
            from_replicas=r.from_replicas,
            to_replicas=r.to_replicas,
            replicas=r.replicas,
        )
    return True


def ready_standbys(state: JobState, view: View, role: str) -> list[str]:
    """The role's standbys that may take a slot now: registered, and checked when pre-flight is on."""
    checked = view.spec.fault_tolerance.preflight
    return [
        n
        for n in state.standbys
        if state.standby_roles.get(n) == role
        and n in view.registrations
        and (not checked or n in state.standbys_checked)
    ]


def grow(plan: Plan, obs: Observation, view: View, checkpointed: bool, job: str, new_id: NewId) -> bool:
    """Grow the shrunk roles that can, at a checkpoint this tick committed (module docstring). True
    if one grew (the decision then starts the restart and nothing else)."""
    state, declared = plan.state, obs.declared_spec.spec
    short = shortfall(state, declared)
    if not short or state.open_incident is not None:
        return False
    sizes: dict[str, tuple[int, int, list[str]]] = {}  # role -> (now, grown, its ready standbys)
    for role in declared.roles:
        if role.name in short:
            current = state.roles[role.name].nodes
            ready = ready_standbys(state, view, role.name)
            size = grown_size(declared, role, current, current + len(ready))
            if size is not None:
                sizes[role.name] = (current, size, ready)
    if not sizes:
        return False
    if not checkpointed:
        _ask_for_checkpoint(plan, view, job, new_id)
        return False
    plan.deletes.append(keys.checkpoint_request(job))
    resizes: list[Resize] = []
    joining: dict[str, list[str]] = {}
    for role in declared.roles:
        if role.name not in sizes:
            continue
        current, size, ready = sizes[role.name]
        joining[role.name] = ready[: size - current]
        for node in joining[role.name]:
            state.standbys.remove(node)
            state.standby_roles.pop(node, None)
        _set_role_slots(state, declared, role.name, [*state.role_slots(role.name), *joining[role.name]])
        resizes.append(_resize(role.name, current, size, role.replicas, plan.now))
    if not resizes:
        return False
    capacity = _capacity(state, declared)
    resizes = [r.model_copy(update={"capacity": capacity}) for r in resizes]
    state.resizes = [*state.resizes, *resizes]
    workers = view.workers
    steps = [w.step for w in workers if w.step is not None]
    step_times = [w.step_time for w in workers if w.step_time]
    grown = ", ".join(f"{r.role} from {r.from_replicas} to {r.to_replicas} nodes" for r in resizes)
    incident = Incident(
        id=f"inc-{state.generation:04d}-{new_id()}",
        job=job,
        failure_class=FailureEvent.ELASTIC_GROW,
        generation=state.generation,
        evidence=[f"{r.role}: {', '.join(joining[r.role])} ready to join at a checkpoint" for r in resizes],
        action=f"grow {grown} at the checkpoint just committed",
        policy_action=FailureAction.RESTART,
        counted=False,
        runbook="elastic_resize",
        role=resizes[0].role if len(declared.roles) > 1 else None,
        resize=resizes[0],
        failed_at=plan.now,
        detected_at=plan.now,
        step_at_failure=max(steps) if steps else None,
        mean_step_time=sum(step_times) / len(step_times) if step_times else None,
    )
    state.infra_restarts += 1
    for r in resizes:
        record = state.roles[r.role]
        record.infra_restarts += 1
        record.incidents = [*record.incidents, incident.id]
    note_progress(plan, workers, force=True)
    state.open_incident = incident.id
    plan.put(keys.incident(job, incident.id), incident)
    plan.enter(Trigger.GROW)
    plan.log("info", "capacity is back: data parallelism grows at a checkpoint", incident=incident.id, grown=grown)
    return True


def _ask_for_checkpoint(plan: Plan, view: View, job: str, new_id: NewId) -> None:
    """A larger size fits: ask every rank to checkpoint at a step just ahead, once per generation,
    so the role grows at that save rather than at the next periodic one."""
    state = plan.state
    step = save_step(view.workers, plan.now)
    if step is None or state.grow_checkpoint_generation == state.generation:
        return
    state.grow_checkpoint_generation = state.generation
    request = CheckpointRequest(
        id=f"grow-{state.generation:04d}-{new_id()}",
        generation=state.generation,
        step=step,
        reason="grow",
        requested_at=plan.now,
    )
    plan.put(keys.checkpoint_request(job), request)
    plan.log("info", "capacity is back: the workers checkpoint early so that the job can grow", step=step)
