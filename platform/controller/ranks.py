"""Rank assignment for a generation: roles in spec order, nodes in slot order, contiguous ranks."""

from __future__ import annotations

import time

from stalwart.spec import TrainingJobSpec
from stalwart.store.records import Assignment, NodeAssignment


def slot_roles(spec: TrainingJobSpec) -> list[str]:
    """The role of each slot (node rank), in order: slot i of the job holds node rank i."""
    return [role.name for role in spec.roles for _ in range(role.replicas)]


def assign(
    job: str,
    spec: TrainingJobSpec,
    slots: list[str],
    generation: int,
    rendezvous: tuple[str, int],
) -> Assignment:
    """A replacement node sits in the lost node's slot, so it inherits that node's ranks."""
    roles = {r.name: r for r in spec.roles}
    per_slot = slot_roles(spec)
    if len(per_slot) != len(slots):
        raise ValueError(f"job needs {len(per_slot)} nodes, got {len(slots)} slots")
    nodes: list[NodeAssignment] = []
    next_rank = 0
    for node_rank, (node, role_name) in enumerate(zip(slots, per_slot, strict=True)):
        procs = roles[role_name].processes_per_node
        nodes.append(
            NodeAssignment(node=node, node_rank=node_rank, role=role_name, first_rank=next_rank, local_world_size=procs)
        )
        next_rank += procs
    return Assignment(
        job=job,
        generation=generation,
        world_size=next_rank,
        master_addr=rendezvous[0],
        master_port=rendezvous[1],
        nodes=nodes,
        created_at=time.time(),
    )
