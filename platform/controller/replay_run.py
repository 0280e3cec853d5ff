"""Running a dual-phase replay (the ladder's last rung) on the job's own nodes.

The plan comes from `stalwart.diagnosis.replay`; this module turns a phase of it into a generation
whose nodes run in independent groups (each its own rendezvous and world size, a few steps from
scratch), judges each group from the agents' heartbeats, and reads the faulty node off the two
failing groups. The job's spec has no pipeline layout, so every node is one data-parallel replica
(PP = 1): the horizontal phase is then the whole job, which has just failed twice and need not run
again, and the vertical phase runs each node alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from stalwart.spec import TrainingJobSpec
from stalwart.store.records import Assignment, Heartbeat, NodeAssignment, ReplayGroupRun, ReplayState

WHOLE_JOB = "the whole job (it has just failed with nothing to blame)"


def replayable(spec: TrainingJobSpec, slots: list[str]) -> str | None:
    """Why this job cannot be replayed, or None."""
    if len(spec.roles) != 1:
        return "replay needs a single-role job (its groups are smaller copies of it)"
    if len(slots) < 2:
        return "replay needs at least two nodes"
    return None


def plan(slots: list[str]) -> ReplayState:
    from stalwart.diagnosis.replay import plan_replay

    layout = plan_replay(1, len(slots), slots)
    state = ReplayState(
        horizontal=[ReplayGroupRun(id=g.id, nodes=g.machines) for g in layout.horizontal],
        vertical=[ReplayGroupRun(id=g.id, nodes=g.machines) for g in layout.vertical],
    )
    for group in state.horizontal:
        if sorted(group.nodes) == sorted(slots):
            group.outcome, group.reason = "failed", WHOLE_JOB
    return state  # horizontal groups all judged already: the controller goes straight to the vertical phase


def phase_assignment(
    job: str,
    spec: TrainingJobSpec,
    groups: list[ReplayGroupRun],
    generation: int,
    rendezvous: Callable[[str], tuple[str, int]],
) -> Assignment:
    """One generation for every group still to run, each group its own little job."""
    role = spec.roles[0]
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
        created_at=time.time(),
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
    """The faulty node (or None) and the sentence that says how the replay found it."""
    from stalwart.diagnosis.replay import ReplayInconclusive, locate, plan_replay

    failed_h = [g.id for g in replay.horizontal if g.outcome == "failed"]
    failed_v = [g.id for g in replay.vertical if g.outcome == "failed"]
    summary = f"replay: horizontal groups failed {failed_h}, vertical groups failed {failed_v}"
    # The plan `plan` made, again: with PP = 1 the horizontal groups hold the slots in order.
    slots = [n for g in replay.horizontal for n in g.nodes]
    try:
        node = locate(plan_replay(1, len(slots), slots), failed_h, failed_v)
    except ReplayInconclusive as exc:
        return None, f"{summary}: inconclusive ({exc})"
    return node, f"{summary}: {node} is in both"
