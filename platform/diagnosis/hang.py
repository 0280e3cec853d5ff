"""Localizing a hang from one round of stacks (ByteRobust's aggregation analysis, refined).

1. Group the ranks by stack signature; the dominant groups are healthy, the rest are outliers.
2. Find the smallest parallel group (TP, CP, EP, PP, DP, a model replica, else a node, else a rank)
   that holds every outlier: that is the group a hang-policy evicts.
3. Follow who waits for whom from the outliers (culprits.py) to the ranks the waits end at, and
   score their machines highest: a replica stuck in send/recv is mostly victims of one rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from stalwart.diagnosis.culprits import Culprits, find_culprits, missing_ranks
from stalwart.diagnosis.models import SuspectGroup
from stalwart.diagnosis.parallel_groups import Layout, smallest_group
from stalwart.diagnosis.stack_groups import EMPTY_SIGNATURE, Aggregation, aggregate
from stalwart.diagnosis.stack_parse import StackParser

GROUP_NODE_SCORE = 0.3  # a machine of the outlier group that no wait ends at
MAX_LISTED_GROUP_NODES = 64
MISSING_FRACTION = 0.25  # more ranks than this without a usable stack: the capture failed, not the ranks


@dataclass
class StackFindings:
    aggregation: Aggregation
    group: SuspectGroup | None
    culprits: Culprits
    missing: list[int]
    node_scores: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    suspect_ranks: dict[str, list[int]] = field(default_factory=dict)
    summary: str = ""
    confidence: float = 0.0


def culprit_score(machines: int) -> float:
    """One machine at the end of every wait is a finding; two are a broken link; many are the job."""
    return 0.95 if machines == 1 else 0.85 if machines == 2 else 0.6 if machines <= 4 else 0.35


def _describe_group(g: SuspectGroup) -> str:
    names = {
        "tp": "TP group",
        "cp": "CP group",
        "ep": "EP group",
        "pp": "pipeline (PP group)",
        "dp": "DP group",
        "mp": "model replica (TP x PP)",
        "node": "node",
        "rank": "rank",
    }
    return f"{names[g.kind]} {g.index}"


def analyze_stacks(
    stacks: Sequence[tuple[int, str]], layout: Layout, parser: StackParser | None = None
) -> StackFindings:
    """Outliers, the group that explains them, and the machines the waits end at."""
    agg = aggregate(stacks, parser, layout.coords["dp"])
    present = [r for r, s in agg.signature.items() if s != EMPTY_SIGNATURE]
    missing = missing_ranks(layout, present)
    if len(missing) > max(1, MISSING_FRACTION * layout.world):
        # e.g. faulthandler dumps taken on a thread with no Python frame: say so, blame no one
        return StackFindings(
            aggregation=agg,
            group=None,
            culprits=Culprits(),
            missing=missing,
            confidence=0.1,
            summary=f"only {len(present)} of {layout.world} ranks gave a usable stack: capture "
            "again (py-spy rather than faulthandler) before evicting anything",
        )
    outliers = [r for r in agg.outliers if agg.signature[r] != EMPTY_SIGNATURE]
    # A failed dump here and there is the capture's noise, not a finding: ranks without a stack are
    # suspects when a wait leads to them, or when nothing else stands out.
    suspicious = sorted(outliers) if outliers else sorted(missing)
    group: SuspectGroup | None = None
    if suspicious:
        found = smallest_group(layout, np.array(suspicious, dtype=np.int64))
        if found is not None:
            group = layout.group(*found)
    start = suspicious or present
    culprits = find_culprits(layout, agg.states, agg.signature, start, missing)
    out = StackFindings(aggregation=agg, group=group, culprits=culprits, missing=missing)
    by_node: dict[str, list[int]] = {}
    for r in sorted(culprits.ranks):
        by_node.setdefault(layout.node_name(r), []).append(r)
    score = culprit_score(len(by_node))
    for node, ranks in by_node.items():
        out.node_scores[node] = score
        out.suspect_ranks[node] = ranks
        out.reasons[node] = [f"rank {r}: {culprits.ranks[r]}" for r in ranks[:4]]
    if group is not None and len(group.nodes) <= MAX_LISTED_GROUP_NODES:
        alone = {1: 0.8, 2: 0.6}.get(len(group.nodes), 0.45) if not by_node else GROUP_NODE_SCORE
        for node in group.nodes:
            if node not in out.node_scores:
                out.node_scores[node] = alone
                out.reasons[node] = [f"in the outlier {_describe_group(group)}"]
                out.suspect_ranks[node] = [r for r in group.ranks if layout.node_name(r) == node][:64]
            else:
                out.reasons[node].append(f"in the outlier {_describe_group(group)}")
    n_out = len(outliers)
    parts = [
        f"{n_out} of {len(agg.signature)} ranks are outliers in {sum(g.outlier for g in agg.groups)} stack group(s)"
    ]
    if missing:
        parts.append(f"{len(missing)} rank(s) gave no stack")
    if group is not None:
        parts.append(f"they share {_describe_group(group)} ({len(group.ranks)} ranks on {len(group.nodes)} machine(s))")
    if by_node:
        first = min(culprits.ranks)
        parts.append(
            f"the waits end at rank(s) {sorted(culprits.ranks)[:6]} on {', '.join(sorted(by_node)[:4])}: "
            f"{culprits.ranks[first]}"
        )
        out.confidence = score
    elif group is not None:
        out.confidence = 0.5
    else:
        out.confidence = 0.2
    out.summary = "; ".join(parts)
    return out
