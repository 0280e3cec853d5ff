"""Where a node's in-memory checkpoint copy goes: a peer that shares none of its parallel groups.

If a node and its peer held ranks of the same TP, PP or DP group, one failure domain could take out
both copies of a shard's only replicas. So the peer is the nearest node (in ring order, to spread
the load evenly) whose ranks share no group with this node's; with none such, the next node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def choose_peers(rank_to_node: Mapping[int, str], groups: Iterable[Iterable[int]]) -> dict[str, str]:
    """node -> peer node, for every node that holds a rank."""
    nodes = sorted(set(rank_to_node.values()))
    if len(nodes) < 2:
        return {}
    neighbours: dict[str, set[str]] = {n: set() for n in nodes}
    for group in groups:
        members = {rank_to_node[r] for r in group}
        for n in members:
            neighbours[n] |= members - {n}
    taken: dict[str, int] = dict.fromkeys(nodes, 0)  # how many nodes already send their copy here
    out: dict[str, str] = {}
    for i, node in enumerate(nodes):
        ring = [nodes[(i + k) % len(nodes)] for k in range(1, len(nodes))]
        outside = [n for n in ring if n not in neighbours[node]]
        candidates = outside or ring
        out[node] = min(candidates, key=lambda n: (taken[n], ring.index(n)))
        taken[out[node]] += 1
    return out
