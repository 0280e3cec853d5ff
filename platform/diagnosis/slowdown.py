"""Localizing a slowdown from repeated rounds of stacks (ByteRobust's fail-slow analysis).

A slow rank shows as an outlier far more often than chance: while the others wait for it in a
collective, it is still computing. In each round the ranks caught active (not waiting in
communication) while most others wait are flagged, when they are few and on one or two machines;
the job is live, so only activity counts, not the hang rules about waits that cannot end. The
machine flagged in most rounds, clearly more than any other and in at least half of them, is the
degrader; the parallel group that held the outliers most often is reported with it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from stalwart.diagnosis.models import SuspectGroup
from stalwart.diagnosis.parallel_groups import Layout, smallest_group
from stalwart.diagnosis.stack_groups import aggregate
from stalwart.diagnosis.stack_parse import StackParser
from stalwart.diagnosis.stack_state import State

MAX_FLAGGED_PER_ROUND = 2  # a round with active ranks on more machines than this says nothing about one
MAX_ACTIVE_FRACTION = 0.25  # ... nor one where many ranks compute at once (no one is waiting for them)


@dataclass
class RoundFindings:
    rounds: int
    node_counts: Counter[str] = field(default_factory=Counter)
    group_counts: Counter[tuple[str, int]] = field(default_factory=Counter)
    node_scores: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    suspect_ranks: dict[str, list[int]] = field(default_factory=dict)
    group: SuspectGroup | None = None
    summary: str = ""
    confidence: float = 0.0


def analyze_rounds(rounds: Sequence[Sequence[tuple[int, str]]], layout: Layout) -> RoundFindings:
    parser = StackParser()  # shared: most dumps repeat from round to round
    out = RoundFindings(rounds=len(rounds))
    rank_counts: Counter[int] = Counter()
    for stacks in rounds:
        agg = aggregate(stacks, parser, layout.coords["dp"])
        waiting = sum(1 for st in agg.states.values() if st.state.waiting)
        active = [r for r, st in agg.states.items() if st.state is State.ACTIVE]
        nodes = {layout.node_name(r) for r in active}
        if (
            active
            and waiting > len(active)
            and len(active) <= max(1, MAX_ACTIVE_FRACTION * len(agg.states))
            and len(nodes) <= MAX_FLAGGED_PER_ROUND
        ):
            out.node_counts.update(nodes)
            rank_counts.update(active)
        if agg.outliers:
            found = smallest_group(layout, np.array(agg.outliers, dtype=np.int64))
            if found is not None:
                out.group_counts[found] += 1
    if not out.node_counts or not rounds:
        out.summary = f"no machine stands out in {len(rounds)} round(s) of stacks"
        out.confidence = 0.3
        return out
    ranked = out.node_counts.most_common()
    node, count = ranked[0]
    runner_up = ranked[1][1] if len(ranked) > 1 else 0
    need = max(2, math.ceil(0.5 * len(rounds)))
    if count >= need and count >= runner_up + 2:
        share = count / len(rounds)
        out.node_scores[node] = round(min(0.95, 0.5 + 0.45 * share), 2)
        ranks = sorted({r for r in rank_counts if layout.node_name(r) == node})
        out.suspect_ranks[node] = ranks
        out.reasons[node] = [
            f"its rank(s) {ranks[:8]} were where the others waited in {count} of {len(rounds)} rounds of stacks"
        ]
        out.confidence = out.node_scores[node]
        out.summary = f"{node} held the others up in {count} of {len(rounds)} rounds of stacks"
    else:
        out.summary = (
            f"no machine stands out in {len(rounds)} rounds of stacks (most often {node}, "
            f"{count} times; next {runner_up})"
        )
        out.confidence = 0.3
    if out.group_counts:
        (kind, index), _n = out.group_counts.most_common(1)[0]
        out.group = layout.group(kind, index)  # type: ignore[arg-type]
    return out
