"""Every rank's parallel groups, as arrays, and the smallest group that contains a set of ranks.

A group of kind K is the set of ranks that agree on every coordinate except K's: a TP group
varies only the TP coordinate, and so on. 'mp' is a model replica (TP x CP x PP, one DP index),
'ep' a run of `ep` consecutive DP ranks, 'node' the ranks on one machine, 'rank' a single rank.
Arrays, not dicts, so that 16,384 ranks cost milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from stalwart.diagnosis.models import GroupKind, SuspectGroup, Topology

# When two kinds give the same smallest group, the earlier one names it.
PREFERENCE: tuple[GroupKind, ...] = ("rank", "tp", "cp", "ep", "pp", "dp", "mp", "node")


@dataclass
class Layout:
    """Coordinates and group ids of every rank (index = rank)."""

    topology: Topology
    coords: dict[str, np.ndarray]  # dimension -> coordinate of each rank
    group_ids: dict[GroupKind, np.ndarray] = field(default_factory=dict)  # kind -> group index of each rank
    nodes: list[str] = field(default_factory=list)  # node index -> name
    node_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def world(self) -> int:
        return self.topology.world_size

    def node_name(self, rank: int) -> str:
        return self.nodes[int(self.node_ids[rank])]

    def members(self, kind: GroupKind, index: int) -> np.ndarray:
        return np.flatnonzero(self.group_ids[kind] == index)

    def peers(self, kind: GroupKind, rank: int) -> np.ndarray:
        return self.members(kind, int(self.group_ids[kind][rank]))

    def neighbour(self, rank: int, dim: str, step: int) -> int | None:
        """The rank one step along a dimension (a pipeline neighbour), or None past the end."""
        stride = 1
        for name, size in self.topology.dims():
            if name == dim:
                c = int(self.coords[dim][rank]) + step
                return rank + step * stride if 0 <= c < size else None
            stride *= size
        return None

    def group(self, kind: GroupKind, index: int) -> SuspectGroup:
        ranks = self.members(kind, index)
        nodes = sorted({self.nodes[i] for i in np.unique(self.node_ids[ranks])})
        return SuspectGroup(kind=kind, index=int(index), ranks=[int(r) for r in ranks], nodes=nodes)


def build_layout(topology: Topology, rank_nodes: dict[int, str] | None = None) -> Layout:
    """Coordinates and groups of every rank; `rank_nodes` adds to the topology's placement."""
    world = topology.world_size
    ranks = np.arange(world, dtype=np.int64)
    coords: dict[str, np.ndarray] = {}
    strides: dict[str, int] = {}
    stride = 1
    for name, size in topology.dims():
        coords[name] = (ranks // stride) % size
        strides[name] = stride
        stride *= size
    ids: dict[GroupKind, np.ndarray] = {"rank": ranks}
    for kind in ("tp", "cp", "pp", "dp"):
        # the rank with this dimension's coordinate zeroed identifies the group; compact it to 0..n-1
        base = ranks - coords[kind] * strides[kind]
        ids[kind] = np.unique(base, return_inverse=True)[1].astype(np.int64)
    replica = coords["dp"]
    ids["mp"] = replica.copy()
    if topology.ep > 1:
        base = ranks - coords["dp"] * strides["dp"] + (coords["dp"] // topology.ep) * strides["dp"]
        ids["ep"] = np.unique(base, return_inverse=True)[1].astype(np.int64)
    placement = {**topology.rank_nodes, **(rank_nodes or {})}
    names = [placement.get(r, f"rank-{r}") for r in range(world)]
    nodes, node_ids = np.unique(np.array(names, dtype=object), return_inverse=True)
    ids["node"] = node_ids.astype(np.int64)
    return Layout(
        topology=topology,
        coords=coords,
        group_ids=ids,
        nodes=[str(n) for n in nodes],
        node_ids=node_ids.astype(np.int64),
    )


def group_size(layout: Layout, kind: GroupKind, index: int) -> int:
    return int(np.count_nonzero(layout.group_ids[kind] == index))


def smallest_group(layout: Layout, ranks: np.ndarray, min_coverage: float = 1.0) -> tuple[GroupKind, int] | None:
    """The smallest group (by rank count) holding at least `min_coverage` of `ranks`, preferring
    parallel groups to nodes on a tie. None when only the whole job would do (it explains nothing)."""
    if ranks.size == 0:
        return None
    best: tuple[int, int, GroupKind, int] | None = None  # (size, preference, kind, index)
    need = int(np.ceil(min_coverage * ranks.size))
    for pref, kind in enumerate(PREFERENCE):
        gid = layout.group_ids.get(kind)
        if gid is None:
            continue
        counts = np.bincount(gid[ranks])
        index = int(np.argmax(counts))
        if counts[index] < need:
            continue
        size = group_size(layout, kind, index)
        if size >= layout.world and layout.world > 1:
            continue
        cand = (size, pref, kind, index)
        if best is None or cand[:2] < best[:2]:
            best = cand
    return None if best is None else (best[2], best[3])
