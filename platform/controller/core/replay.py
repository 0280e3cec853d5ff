"""Dual-phase replay (the ladder's last rung) on the job's own nodes: its plan and its stages.

The plan comes from `stalwart.diagnosis.replay` (ByteRobust's grouping: horizontal groups of
m = k x PP machines, k whole pipelines each, n = DP/k of them; vertical groups one pipeline each,
assembled diagonally across the horizontal ones), laid over the job's machine grid, which the
job's Topology derives from the spec's parallelism (stalwart.spec.topology.Topology.machine_grid).
This module turns a phase of the plan into a generation whose nodes run in independent groups
(each a smaller copy of the job: its own rendezvous, the same TP, CP and PP, fewer data-parallel
replicas, a few steps from scratch), judges each group from the agents' heartbeats, and reads the
faulty node off the two failing groups.

In a multi-role job each role is its own world, so a failure that stays in one role
(`restartScope: Role`) is replayed within that role: its own nodes, its own layout, groups that are
smaller copies of the role, while the other roles keep their processes. A job with a data plane is
not replayed: its roles' workers would run against the live relay and weights channel.

A group's nodes are kept in rank order (stage-major: stage 0 of each of its pipelines, then stage
1, ...), so node i of a group holds ranks i x processesPerNode.. of the group's own layout. A group
that is the whole job (plain data parallelism on few nodes) has just failed and is not run again.

The stages (ReplayHorizontal, ReplayVertical, below): launch the phase's groups as one generation,
judge each group from the heartbeats, then the vertical phase, then read the faulty node off the
failing groups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from stalwart.controller.core.decision import Needs, Plan
from stalwart.controller.core.observation import Observation
from stalwart.controller.core.standbys import evict
from stalwart.controller.core.transitions import Trigger
from stalwart.spec import Role, TrainingJobSpec
from stalwart.spec.topology import MachineGrid, Topology, stage_major
from stalwart.store import keys
from stalwart.store.records import Assignment, Heartbeat, JobStage, NodeAssignment, ReplayGroupRun, ReplayState

# -- the plan, the groups' assignments, their verdicts ---------------------------------------------------

WHOLE_JOB = "the whole job (it has just failed with nothing to blame)"


def _role(spec: TrainingJobSpec, role: str | None) -> Role:
    return spec.roles[0] if role is None else next(r for r in spec.roles if r.name == role)


def rank_nodes(spec: TrainingJobSpec, slots: list[str]) -> dict[int, str]:
    """Job-wide rank -> node: the roles in spec order on consecutive slots (as ranks.assign lays them)."""
    out: dict[int, str] = {}
    nodes = iter(slots)
    for role in spec.roles:
        for _ in range(role.replicas):
            node = next(nodes)
            for _ in range(role.processes_per_node):
                out[len(out)] = node
    return out


def machine_grid(spec: TrainingJobSpec, slots: list[str], role: str | None = None) -> MachineGrid:
    """The role's nodes (the job's, for a single-role job) as pipeline stages x data-parallel blocks
    (ValueError says why not)."""
    return Topology.from_spec(spec, rank_nodes(spec, slots)).machine_grid(role)


def replayable(spec: TrainingJobSpec, slots: list[str], role: str | None = None) -> str | None:
    """Why this job (or, in a multi-role job, this role) cannot be replayed, or None."""
    if len(spec.roles) > 1:
        if role is None:
            return "replay of a multi-role job needs the failure to stay in one role (restartScope: Role)"
        if spec.data_plane is not None:
            return (
                f"replay of role {role!r} would run its workers against the job's live data plane (a replayed "
                "actor publishes weights the rollouts load; rollout, reward and reference workers report no "
                "steps to judge them by)"
            )
    elif role is not None and role != spec.roles[0].name:
        return f"no role {role!r}"
    if _role(spec, role).replicas < 2:
        return "replay needs at least two nodes" + (f" in role {role!r}" if role else "")
    try:
        grid = machine_grid(spec, slots, role)
    except ValueError as exc:
        return f"replay needs whole machines per pipeline stage: {exc}"
    if grid.dp < grid.pp:
        return (
            f"replay of {grid.dp} data-parallel machine column(s) under {grid.pp} pipeline stages needs "
            f"{grid.pp - grid.dp} known-good spare machine(s) in its vertical groups, which is not supported yet"
        )
    if grid.replicas_per_machine % _role(spec, role).parallelism.expert:
        return "replay needs each node's data-parallel replicas to hold whole expert-parallel groups"
    return None


def plan_phases(spec: TrainingJobSpec, slots: list[str], role: str | None = None) -> ReplayState:
    """The replay's groups over the machine grid of the job (or of the failed role); a horizontal
    group that is all of it counts as failed already."""
    from stalwart.diagnosis.replay import plan_replay

    grid = machine_grid(spec, slots, role)
    layout = plan_replay(grid.pp, grid.dp, grid.machines)
    state = ReplayState(
        horizontal=[ReplayGroupRun(id=g.id, nodes=stage_major(g.pipelines)) for g in layout.horizontal],
        vertical=[ReplayGroupRun(id=g.id, nodes=stage_major(g.pipelines)) for g in layout.vertical],
        role=role if len(spec.roles) > 1 else None,
    )
    for group in state.horizontal:
        if sorted(group.nodes) == sorted(grid.machines):
            group.outcome, group.reason = "failed", WHOLE_JOB
    return state  # horizontal groups all judged already: the controller goes straight to the vertical phase


def phase_assignment(
    job: str,
    spec: TrainingJobSpec,
    groups: list[ReplayGroupRun],
    generation: int,
    rendezvous: Callable[[str], tuple[str, int]],
    role_name: str | None = None,
    *,
    created_at: float,
) -> Assignment:
    """One generation for every group still to run, each group its own little job (a smaller copy
    of the replayed role)."""
    role = _role(spec, role_name)
    procs = role.processes_per_node
    nodes: list[NodeAssignment] = []
    for group in groups:
        addr, port = rendezvous(group.nodes[0])
        for i, node in enumerate(group.nodes):
            nodes.append(
                NodeAssignment(
                    node=node,
                    node_rank=i,
                    role=role.name,
                    first_rank=i * procs,
                    local_world_size=procs,
                    group=group.id,
                    master_addr=addr,
                    master_port=port,
                    world_size=len(group.nodes) * procs,
                )
            )
    first = nodes[0]
    return Assignment(
        job=job,
        generation=generation,
        world_size=first.world_size or procs,
        master_addr=first.master_addr or "",
        master_port=first.master_port or 0,
        nodes=nodes,
        created_at=created_at,
    )


def judge(
    group: ReplayGroupRun,
    beats: Mapping[str, Heartbeat],
    registered: set[str],
    generation: int,
    procs: int,
    started_at: float,
    timeout: float,
    now: float,
) -> tuple[str, str] | None:
    """("passed" | "failed", why) once the group's outcome is known, else None."""
    lost = [n for n in group.nodes if n not in registered]
    if lost:
        return "failed", f"lost {', '.join(lost)}"
    workers = [(n, w) for n in group.nodes if (b := beats.get(n)) and b.generation == generation for w in b.workers]
    bad = [(n, w) for n, w in workers if w.exit_code not in (None, 0)]
    if bad:
        node, worker = bad[0]
        return "failed", f"rank {worker.rank} on {node} exited with code {worker.exit_code} at step {worker.step}"
    if len(workers) == len(group.nodes) * procs and all(w.exit_code == 0 for _, w in workers):
        return "passed", f"{len(workers)} workers ran their steps and exited 0"
    progress = max([w.last_progress_at for _, w in workers if w.last_progress_at] + [started_at])
    if now - progress > timeout:
        return "failed", f"no progress for {now - progress:.0f}s"
    return None


def conclusion(replay: ReplayState) -> tuple[str | None, str]:
    """The faulty node (or None) and the sentence that says how the replay found it: the one node
    the failing horizontal and the failing vertical group share."""
    from stalwart.diagnosis.replay import ReplayInconclusive, common_machine

    failed_h = [g for g in replay.horizontal if g.outcome == "failed"]
    failed_v = [g for g in replay.vertical if g.outcome == "failed"]
    ids_h, ids_v = [g.id for g in failed_h], [g.id for g in failed_v]
    summary = f"replay: horizontal groups failed {ids_h}, vertical groups failed {ids_v}"
    if len(failed_h) != 1 or len(failed_v) != 1:
        return None, (
            f"{summary}: inconclusive (dual-phase replay singles out one faulty machine when exactly one "
            "group of each phase fails)"
        )
    h, v = failed_h[0], failed_v[0]
    try:
        node = common_machine(h.id, h.nodes, v.id, v.nodes)
    except ReplayInconclusive as exc:
        return None, f"{summary}: inconclusive ({exc})"
    return node, f"{summary}: {node} is in both"


# -- the replay stages -----------------------------------------------------------------------------------


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
    assignment = phase_assignment(
        job, spec, pending, generation, lambda node: obs.rendezvous[node], replay.role, created_at=plan.now
    )
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
