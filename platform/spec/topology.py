"""The job's parallel layout as data: every rank's coordinates, the parallel groups, and where ranks run.

One `Topology` serves every consumer of the layout: hang localization (the diagnosis engine's
`models.Topology` is made from it), dual-phase replay (the machine grid of pipeline stages by
data-parallel replicas), memory-tier checkpoint peers (outside every group of a node's ranks), the
status and the CLI. It is built from the spec's per-role `parallelism` and, when known, the
generation's rank -> node placement.

Ranks follow Megatron-core's default order "tp-cp-ep-dp-pp": tensor fastest, pipeline slowest, and
expert parallelism subdividing data parallelism. Within a role whose ranks start at `first`:

    rank = first + tp + TP * (cp + CP * (dp + DP * pp)),   ep = dp % EP

Roles take consecutive rank ranges in spec order (as the controller assigns them), each its own
layout; no group spans two roles.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from stalwart.spec.model import Parallelism, Role, TrainingJobSpec

GroupKind = Literal["tp", "cp", "ep", "dp", "pp"]
GROUP_KINDS: tuple[GroupKind, ...] = ("tp", "cp", "ep", "dp", "pp")


class RankCoords(NamedTuple):
    """A rank's place in its role's layout (ep is its index inside its expert-parallel group)."""

    role: str
    tp: int
    cp: int
    dp: int
    pp: int
    ep: int


@dataclass(frozen=True)
class RoleLayout:
    """One role's sizes and where its ranks start."""

    role: str
    first_rank: int
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    ep: int = 1
    processes_per_node: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "dp", "pp", "ep", "processes_per_node"):
            if getattr(self, name) < 1:
                raise ValueError(f"role {self.role!r}: {name} must be at least 1, got {getattr(self, name)}")
        if self.dp % self.ep:
            raise ValueError(f"role {self.role!r}: expert {self.ep} does not divide the data-parallel size {self.dp}")

    @classmethod
    def of(cls, role: Role, first_rank: int = 0, world: int | None = None) -> RoleLayout:
        """The role's layout over `world` ranks (default: the role's own; a replay group's is smaller)."""
        p: Parallelism = role.parallelism
        size = role.world_size if world is None else world
        problem = p.problem(size)
        if problem:
            raise ValueError(f"role {role.name!r}: {problem}")
        return cls(
            role=role.name,
            first_rank=first_rank,
            tp=p.tensor,
            cp=p.context,
            dp=size // p.model_parallel,
            pp=p.pipeline,
            ep=p.expert,
            processes_per_node=role.processes_per_node,
        )

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def holds(self, rank: int) -> bool:
        return self.first_rank <= rank < self.first_rank + self.world_size

    def coords(self, rank: int) -> RankCoords:
        if not self.holds(rank):
            raise ValueError(f"rank {rank} is not in role {self.role!r} (ranks {self.first_rank}..{self.last_rank})")
        rest = rank - self.first_rank
        tp, rest = rest % self.tp, rest // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        dp, pp = rest % self.dp, rest // self.dp
        return RankCoords(self.role, tp, cp, dp, pp, dp % self.ep)

    @property
    def last_rank(self) -> int:
        return self.first_rank + self.world_size - 1

    def rank(self, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return self.first_rank + tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def size(self, kind: GroupKind) -> int:
        return {"tp": self.tp, "cp": self.cp, "ep": self.ep, "dp": self.dp, "pp": self.pp}[kind]

    def group_key(self, kind: GroupKind, rank: int) -> tuple[int, ...]:
        """What the members of the rank's group of this kind agree on."""
        c = self.coords(rank)
        if kind == "tp":
            return (c.cp, c.dp, c.pp)
        if kind == "cp":
            return (c.tp, c.dp, c.pp)
        if kind == "dp":
            return (c.tp, c.cp, c.pp)
        if kind == "pp":
            return (c.tp, c.cp, c.dp)
        return (c.tp, c.cp, c.pp, c.dp // self.ep)

    def groups(self, kind: GroupKind) -> list[list[int]]:
        """Every group of this kind, as sorted global ranks, in the order of their first rank."""
        out: dict[tuple[int, ...], list[int]] = {}
        for rank in range(self.first_rank, self.first_rank + self.world_size):
            out.setdefault(self.group_key(kind, rank), []).append(rank)
        return list(out.values())

    def describe(self) -> str:
        parts = [f"tp {self.tp}", f"pp {self.pp}", f"dp {self.dp}"]
        if self.cp > 1:
            parts.insert(1, f"cp {self.cp}")
        if self.ep > 1:
            parts.append(f"ep {self.ep}")
        return " x ".join(parts)


class MachineGrid(NamedTuple):
    """A role's nodes as replay sees them: `machines[s * dp + r]` holds pipeline stage s of the
    r-th block of `replicas_per_machine` data-parallel replicas (TP and CP inside the machine)."""

    pp: int
    dp: int
    machines: list[str]
    replicas_per_machine: int


@dataclass(frozen=True)
class Topology:
    """The whole job's layout: its roles' layouts and, when known, which node runs each rank."""

    roles: tuple[RoleLayout, ...]
    rank_nodes: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        expected = 0
        for layout in self.roles:
            if layout.first_rank != expected:
                raise ValueError(f"role {layout.role!r} starts at rank {layout.first_rank}, expected {expected}")
            expected += layout.world_size

    @classmethod
    def from_spec(cls, spec: TrainingJobSpec, rank_nodes: Mapping[int, str] | None = None) -> Topology:
        """Roles in spec order, each on the next consecutive ranks (as the controller assigns them)."""
        layouts, first = [], 0
        for role in spec.roles:
            layouts.append(RoleLayout.of(role, first))
            first += role.world_size
        return cls(tuple(layouts), dict(rank_nodes or {}))

    @classmethod
    def for_role(cls, role: Role, world: int, rank_nodes: Mapping[int, str] | None = None) -> Topology:
        """One role alone on `world` ranks: a replay group, a smaller copy of the job."""
        return cls((RoleLayout.of(role, 0, world),), dict(rank_nodes or {}))

    def with_nodes(self, rank_nodes: Mapping[int, str]) -> Topology:
        return Topology(self.roles, dict(rank_nodes))

    # -- ranks -------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return sum(r.world_size for r in self.roles)

    def layout_of(self, rank: int) -> RoleLayout:
        for layout in self.roles:
            if layout.holds(rank):
                return layout
        raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")

    def role(self, name: str) -> RoleLayout:
        for layout in self.roles:
            if layout.role == name:
                return layout
        raise KeyError(f"no role {name!r} (roles: {', '.join(r.role for r in self.roles)})")

    def coords(self, rank: int) -> RankCoords:
        return self.layout_of(rank).coords(rank)

    # -- groups ------------------------------------------------------------------------------------
    def groups(self, kind: GroupKind) -> list[list[int]]:
        return [g for layout in self.roles for g in layout.groups(kind)]

    def parallel_groups(self) -> list[list[int]]:
        """Every group of every kind with more than one rank: what a failure domain must not span."""
        return [g for kind in GROUP_KINDS for g in self.groups(kind) if len(g) > 1]

    def groups_of(self, rank: int) -> dict[GroupKind, list[int]]:
        """The rank's group of each kind (itself alone where that kind's size is 1)."""
        layout = self.layout_of(rank)
        out: dict[GroupKind, list[int]] = {}
        for kind in GROUP_KINDS:
            key = layout.group_key(kind, rank)
            out[kind] = [
                r
                for r in range(layout.first_rank, layout.first_rank + layout.world_size)
                if layout.group_key(kind, r) == key
            ]
        return out

    # -- nodes -------------------------------------------------------------------------------------
    def node_of(self, rank: int) -> str | None:
        return self.rank_nodes.get(rank)

    def nodes(self) -> list[str]:
        """The nodes in the order of their first rank."""
        return list(dict.fromkeys(self.rank_nodes[r] for r in sorted(self.rank_nodes)))

    def ranks_on(self, node: str) -> list[int]:
        return sorted(r for r, n in self.rank_nodes.items() if n == node)

    def group_nodes(self, ranks: Iterable[int]) -> list[str]:
        """The nodes that run these ranks, in rank order."""
        return list(dict.fromkeys(n for r in sorted(ranks) if (n := self.rank_nodes.get(r)) is not None))

    def machine_grid(self, role: str | None = None) -> MachineGrid:
        """The role's nodes as a grid of pipeline stages by blocks of data-parallel replicas, for
        dual-phase replay. Raises ValueError (saying why) when a node does not hold whole TP x CP
        slices of one stage, as replay's groups must be whole pipelines of whole machines."""
        layout = self.role(role) if role is not None else self._only_role()
        procs, slice_ = layout.processes_per_node, layout.tp * layout.cp
        if procs % slice_:
            raise ValueError(
                f"role {layout.role!r}: a node's {procs} processes do not hold whole tensor x context "
                f"slices of {slice_} ranks, so a node is not a replay unit"
            )
        per_node = procs // slice_
        if layout.dp % per_node:
            raise ValueError(
                f"role {layout.role!r}: a node holds {per_node} data-parallel replicas of a stage, which does "
                f"not divide DP {layout.dp} (a node would span two pipeline stages)"
            )
        columns = layout.dp // per_node
        machines = []
        for stage in range(layout.pp):
            for column in range(columns):
                node = self.rank_nodes.get(layout.rank(dp=column * per_node, pp=stage))
                if node is None:
                    raise ValueError(f"role {layout.role!r}: no node placed for stage {stage}, replicas block {column}")
                machines.append(node)
        if len(set(machines)) != len(machines):
            raise ValueError(f"role {layout.role!r}: a node holds ranks of more than one grid cell")
        return MachineGrid(pp=layout.pp, dp=columns, machines=machines, replicas_per_machine=per_node)

    def _only_role(self) -> RoleLayout:
        if len(self.roles) != 1:
            raise ValueError("the job has several roles: name one")
        return self.roles[0]

    def describe(self) -> str:
        return "; ".join(f"{r.role}: {r.describe()}" for r in self.roles)


def stage_major(pipelines: Sequence[Sequence[str]]) -> list[str]:
    """A replay group's nodes in rank order: stage 0 of every pipeline, then stage 1, ... (so that
    node i of the group holds ranks i*procs.. of a smaller copy of the job's layout)."""
    stages = max((len(p) for p in pipelines), default=0)
    return [p[s] for s in range(stages) for p in pipelines if s < len(p)]
