"""Grouping ranks by stack signature; the dominant groups are healthy, the rest are outliers.

A signature is a hash of the kept thread's normalized Python frames. Native frames stay out of it:
py-spy --native works on some ranks and not on others, and the same place in the code must group
together whichever way it was captured. A dump with no Python frame at all is signed by its
native frames.

Which groups are dominant: with data parallelism, a healthy place in the code shows up in many
model replicas (every healthy replica's stage-s ranks wait in the same spot), a fault's in one or
few; so with 3 or more replicas a group is healthy when it spans at least half of them. Pipeline
stages split the healthy ranks into groups of very different sizes, which a size rule would
misread. With fewer replicas (or without a layout) the size rule decides: healthy when at least
half the size of the largest group, and at least 2 ranks.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from stalwart.diagnosis.models import StackGroup
from stalwart.diagnosis.stack_parse import ParsedStack, StackParser
from stalwart.diagnosis.stack_state import RankState, classify

DOMINANT_FRACTION = 0.5  # a group at least half the size of the largest is healthy (and at least 2 ranks)
EMPTY_SIGNATURE = "empty"


@dataclass
class Aggregation:
    groups: list[StackGroup]  # largest first
    signature: dict[int, str]  # rank -> signature
    states: dict[int, RankState]
    outliers: list[int]
    parsed: dict[str, ParsedStack] = field(default_factory=dict)  # signature -> an example


def _sign(frames: tuple[str, ...]) -> str:
    if not frames:
        return EMPTY_SIGNATURE
    return hashlib.sha1("\n".join(frames).encode()).hexdigest()[:12]


def aggregate(
    stacks: Iterable[tuple[int, str]], parser: StackParser | None = None, replica_of: np.ndarray | None = None
) -> Aggregation:
    """Group (rank, dump text) pairs by signature and mark the outliers; `replica_of[rank]` is the
    rank's data-parallel index, when the layout is known."""
    parser = parser or StackParser()
    by_frames: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, RankState]] = {}
    examples: dict[str, ParsedStack] = {}
    members: dict[str, list[int]] = {}
    signature: dict[int, str] = {}
    states: dict[int, RankState] = {}
    for rank, text in stacks:
        parsed = parser.parse(text)
        key = (parsed.frames, parsed.native)  # equal frames, equal verdict: dumps differ in addresses
        known = by_frames.get(key)
        if known is None:
            known = (_sign(parsed.frames or parsed.native), classify(parsed))
            by_frames[key] = known
            examples.setdefault(known[0], parsed)
        sig, st = known
        signature[rank] = sig
        states[rank] = st
        members.setdefault(sig, []).append(rank)
    ordered = sorted(members.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    top = len(ordered[0][1]) if ordered else 0
    healthy_min = max(2.0, DOMINANT_FRACTION * top)
    replicas = int(replica_of.max()) + 1 if replica_of is not None and replica_of.size else 1
    need_replicas = max(2, math.ceil(replicas / 2))
    groups: list[StackGroup] = []
    outliers: list[int] = []
    for sig, ranks in ordered:
        ranks.sort()
        ex = examples[sig]
        if replicas >= 3 and replica_of is not None:
            spans = np.unique(replica_of[np.array([r for r in ranks if r < replica_of.size], dtype=np.int64)]).size
            is_out = spans < need_replicas
        else:
            is_out = len(ranks) < healthy_min
        is_out = is_out or sig == EMPTY_SIGNATURE
        if is_out:
            outliers.extend(ranks)
        groups.append(
            StackGroup(
                signature=sig,
                frames=list((ex.frames or ex.native)[:256]),
                ranks=ranks,
                count=len(ranks),
                outlier=is_out,
                state=states[ranks[0]].state.value,
            )
        )
    outliers.sort()
    return Aggregation(groups=groups, signature=signature, states=states, outliers=outliers, parsed=examples)
