"""Following who waits for whom, from the outlier ranks to the ranks the wait ends at.

In a hang most ranks wait, and each wait names (or implies) the ranks it waits for: a pipeline
receive waits for the neighbouring stage, a collective for the members of its group that have not
joined it. Following those edges from the outliers ends at a rank that waits for nobody (it is
active: computing, sleeping, stuck in user code), at a wait that can never end (a receive from a
stage that has already moved past the matching send), at a transfer both sides are stuck in (a
broken link), at a collective every member has entered and none leaves, or at a rank whose stack
could not be captured. Those are the culprits; the healthy majority only waits on them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from stalwart.diagnosis.parallel_groups import Layout
from stalwart.diagnosis.stack_state import Phase, RankState, State

MAX_VISITS = 200_000  # bounds the walk whatever the bundle


@dataclass
class Culprits:
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> why it is a culprit
    visited: int = 0  # ranks the walk went through

    def add(self, rank: int, reason: str) -> None:
        self.ranks.setdefault(rank, reason)


def _matching_peer(layout: Layout, rank: int, st: RankState) -> int | None:
    """The pipeline neighbour a directed p2p op talks to."""
    forward = st.direction == "forward"
    recv = st.state is State.P2P_RECV
    step = -1 if forward == recv else +1  # recv_forward/send_backward: previous stage; else next
    return layout.neighbour(rank, "pp", step)


def _p2p_edges(layout: Layout, rank: int, st: RankState, states: dict[int, RankState], out: Culprits) -> list[int]:
    if not st.direction or layout.topology.pp <= 1:
        return []
    peer = _matching_peer(layout, rank, st)
    verb = "receive" if st.state is State.P2P_RECV else "send"
    if peer is None:
        out.add(rank, f"waits in a {st.direction} pipeline {verb} with no stage on that side")
        return []
    ps = states.get(peer)
    if ps is None:
        return [peer]
    if (
        ps.state in (State.P2P_RECV, State.P2P_SEND)
        and ps.state is not st.state
        and ps.direction == st.direction
        and _matching_peer(layout, peer, ps) == rank
    ):
        out.add(rank, f"stuck in a {st.direction} transfer with rank {peer}, which is stuck in it too (the link)")
        out.add(peer, f"stuck in a {st.direction} transfer with rank {rank}, which is stuck in it too (the link)")
        return []
    # The matching op happens in the phase of the transfer's direction; a peer that waits in a later
    # phase has already done it (or never will): this wait cannot end.
    expected = Phase.FORWARD if st.direction == "forward" else Phase.BACKWARD
    if ps.state.waiting and ps.phase is not Phase.UNKNOWN and st.phase is not Phase.UNKNOWN and ps.phase > expected:
        out.add(
            rank,
            f"waits in a {st.direction} pipeline {verb} with rank {peer}, "
            f"which has moved on to its {ps.phase.name.lower()} phase",
        )
        return []
    return [peer]


def _collective_edges(
    layout: Layout, rank: int, st: RankState, states: dict[int, RankState], signature: dict[int, str], out: Culprits
) -> list[int]:
    if not st.scope or st.scope not in layout.group_ids:
        return []
    peers = layout.peers(st.scope, rank)
    mine = signature.get(rank)
    others = [int(p) for p in peers if p != rank]
    elsewhere = [p for p in others if p in signature and signature[p] != mine]
    if elsewhere:  # the members seen doing something else are the ones it waits for
        return elsewhere
    unseen = [p for p in others if p not in signature]
    if unseen:  # else the members whose stack is missing are the only explanation
        return unseen
    if all(int(p) in states for p in peers) and len(peers) > 1:
        for p in peers:
            out.add(
                int(p), f"every member of its {st.scope.upper()} group is inside the same {st.op} and none leaves it"
            )
    return []


def find_culprits(
    layout: Layout,
    states: dict[int, RankState],
    signature: dict[int, str],
    start: Iterable[int],
    missing: Iterable[int] = (),
) -> Culprits:
    """Walk the wait-for edges from `start` (the outliers); `missing` are ranks with no stack.
    One breadth-first walk from every start at once: each rank is expanded once."""
    out = Culprits()
    missing_set = set(missing)
    queue = deque(dict.fromkeys(start))
    seen = set(queue)
    visits = 0
    while queue and visits < MAX_VISITS:
        r = queue.popleft()
        visits += 1
        if r in missing_set:
            out.add(r, "no stack could be captured from it (dead, or stuck in the kernel)")
            continue
        st = states.get(r)
        if st is None:
            continue
        if st.state is State.ACTIVE:
            out.add(r, f"not waiting for anyone: active in {st.where or 'its own code'}")
            continue
        if st.state in (State.P2P_RECV, State.P2P_SEND):
            nxt = _p2p_edges(layout, r, st, states, out)
        elif st.state is State.COLLECTIVE:
            nxt = _collective_edges(layout, r, st, states, signature, out)
        else:
            nxt = []
        for n in nxt:
            if n not in seen:
                seen.add(n)
                queue.append(n)
    out.visited = len(seen)
    return out


def missing_ranks(layout: Layout, present: Iterable[int]) -> list[int]:
    have = np.zeros(layout.world, dtype=bool)
    idx = np.fromiter((r for r in present if 0 <= r < layout.world), dtype=np.int64)
    have[idx] = True
    return [int(r) for r in np.flatnonzero(~have)]
