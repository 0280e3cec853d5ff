"""Where a node's in-memory checkpoint copy goes: a peer that shares none of its parallel groups.

If a node and its peer held ranks of the same TP, PP or DP group, one failure domain could take out
both copies of a shard's only replicas. So the peer is the nearest node (in ring order, to spread
the load evenly) whose ranks share no group with this node's; with none such, the next node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping


def choose_peers(rank_to_node: Mapping[int, str], groups: Iterable[Iterable[int]]) -> dict[str, str]:
    """node -> peer node, for every node that holds a rank.

    For each node in order: the candidates are the other nodes in ring order from it, those sharing
    no group with it if there are any; the peer is the candidate that the fewest nodes chose before,
    the nearest in the ring among equals. Near-linear at 10,000 nodes: no neighbour sets are built
    (one data-parallel group may hold every node), a scan jumps over a group's run of consecutive
    nodes and over nodes already chosen at once (_Unchosen)."""
    nodes = sorted(set(rank_to_node.values()))
    count = len(nodes)
    if count < 2:
        return {}
    index = {n: i for i, n in enumerate(nodes)}
    groups_of: list[set[int]] = [set() for _ in nodes]  # node -> the groups its ranks are in
    spans: list[int] = []  # group -> how many nodes it holds
    run_end: list[dict[int, int]] = []  # group -> member node -> the last node of its run of members
    for g, group in enumerate(groups):
        members = sorted({index[rank_to_node[r]] for r in group})
        spans.append(len(members))
        ends: dict[int, int] = {}
        for m in reversed(members):
            ends[m] = ends.get(m + 1, m)
        run_end.append(ends)
        for i in members:
            groups_of[i].add(g)
    taken = [0] * count  # how many nodes already send their copy here
    unchosen = _Unchosen(count)
    out: dict[str, str] = {}
    for i, node in enumerate(nodes):
        mine = groups_of[i]

        def shared_run(j: int, mine: set[int] = mine) -> int | None:
            """Where the run of nodes from j that share a group with this node ends (None: j shares none)."""
            return max((run_end[g][j] for g in groups_of[j] & mine), default=None)

        def anyone(j: int) -> int | None:
            return None

        chosen = None
        if not any(spans[g] == count for g in mine):  # a group of every node leaves nothing outside
            chosen = unchosen.nearest(i, shared_run)
            if chosen is None:
                chosen = _least_taken(i, count, taken, shared_run)
        if chosen is None:
            chosen = unchosen.nearest(i, anyone)
            if chosen is None:
                chosen = _least_taken(i, count, taken, anyone)
        assert chosen is not None  # count >= 2: the ring is never empty
        out[node] = nodes[chosen]
        taken[chosen] += 1
        unchosen.remove(chosen)
    return out


class _Unchosen:
    """The nodes no node chose yet, for a "next one at or after j" in near-constant time (a
    union-find over positions that points each chosen node at its successor)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.next = list(range(count + 1))  # count: none left after this point

    def at_or_after(self, j: int) -> int:
        root = j
        while self.next[root] != root:
            root = self.next[root]
        while self.next[j] != root:  # path compression
            self.next[j], j = root, self.next[j]
        return root

    def remove(self, j: int) -> None:
        self.next[j] = j + 1

    def nearest(self, i: int, excluded: Callable[[int], int | None]) -> int | None:
        """The first unchosen node after i in ring order that `excluded` lets through (it returns
        None for a candidate, or where a run of excluded nodes starting at it ends)."""
        for start, stop in ((i + 1, self.count), (0, i)):
            pos = start
            while pos < stop:
                j = self.at_or_after(pos)
                if j >= stop:
                    break
                end = excluded(j)
                if end is None:
                    return j
                pos = end + 1
        return None


def _least_taken(i: int, count: int, taken: list[int], excluded: Callable[[int], int | None]) -> int | None:
    """The node after `i` in ring order with the least `taken`, the nearest among equals, among
    those `excluded` lets through (every candidate was chosen already: a full scan)."""
    best: int | None = None
    k = 1
    while k < count:
        j = (i + k) % count
        end = excluded(j)
        if end is not None:
            k += max(end - j, 0) + 1
            continue
        if best is None or taken[j] < taken[best]:
            best = j
        k += 1
    return best
