"""Rank assignment for a generation: roles in spec order, nodes in slot order, contiguous ranks.

In a multi-role job each role is also its own world (issue 18): its workers see ranks from 0, the
role's world size and the role's own rendezvous, while the job-wide ranks (`first_rank`) keep naming
each worker uniquely to the control plane.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stalwart.spec import TrainingJobSpec
from stalwart.spec.model import RestartScope
from stalwart.store.records import Assignment, NodeAssignment, RoleState


def slot_roles(spec: TrainingJobSpec) -> list[str]:
    """The role of each slot (node rank), in order: slot i of the job holds node rank i."""
    return [role.name for role in spec.roles for _ in range(role.replicas)]


def role_states(spec: TrainingJobSpec) -> dict[str, RoleState]:
    """Each role's place in the job (its slots and job-wide ranks), before anything ran."""
    out: dict[str, RoleState] = {}
    slot = rank = 0
    for role in spec.roles:
        out[role.name] = RoleState(
            name=role.name,
            first_slot=slot,
            nodes=role.replicas,
            first_rank=rank,
            world_size=role.world_size,
            restart_scope="Role" if role.restart_scope is RestartScope.ROLE else "Job",
        )
        slot += role.replicas
        rank += role.world_size
    return out


@dataclass(frozen=True)
class RoleWorld:
    """A role's own world for one assignment: its rendezvous and its generation."""

    master_addr: str
    master_port: int
    generation: int


def assign(
    job: str,
    spec: TrainingJobSpec,
    slots: list[str],
    generation: int,
    rendezvous: tuple[str, int],
    worlds: Mapping[str, RoleWorld] | None = None,
    memory: Mapping[str, str] | None = None,
    *,
    created_at: float,
) -> Assignment:
    """A replacement node sits in the lost node's slot, so it inherits that node's ranks. With
    `worlds` (role -> its world), each role's workers form their own world. `memory`: node -> its
    host-memory checkpoint store, carried to every agent in the assignment. `created_at`: the
    decision's time (the core reads no clock)."""
    roles = {r.name: r for r in spec.roles}
    per_slot = slot_roles(spec)
    if len(per_slot) != len(slots):
        raise ValueError(f"job needs {len(per_slot)} nodes, got {len(slots)} slots")
    nodes: list[NodeAssignment] = []
    next_rank = 0
    role_start: dict[str, tuple[int, int]] = {}  # role -> (its first node rank, its first job-wide rank)
    for node_rank, (node, role_name) in enumerate(zip(slots, per_slot, strict=True)):
        procs = roles[role_name].processes_per_node
        first_node, first_rank = role_start.setdefault(role_name, (node_rank, next_rank))
        entry = NodeAssignment(
            node=node,
            node_rank=node_rank,
            role=role_name,
            first_rank=next_rank,
            local_world_size=procs,
            memory=(memory or {}).get(node),
        )
        world = worlds.get(role_name) if worlds is not None else None
        if world is not None:
            entry.master_addr, entry.master_port = world.master_addr, world.master_port
            entry.world_size = roles[role_name].world_size
            entry.role_first_rank = next_rank - first_rank
            entry.role_node_rank = node_rank - first_node
            entry.role_generation = world.generation
        nodes.append(entry)
        next_rank += procs
    return Assignment(
        job=job,
        generation=generation,
        world_size=next_rank,
        master_addr=rendezvous[0],
        master_port=rendezvous[1],
        nodes=nodes,
        created_at=created_at,
    )
