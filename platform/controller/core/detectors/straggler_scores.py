"""Per-rank performance scores (NVRx's relative and individual scores), pure: no clock, no store.

A rank's own work in a step is the time it spends on what no other rank can make it wait for: its
data loading, its optimizer step and the rest of its step outside the timed phases (the SDK's
`other`). Compute and comm are left out: in data-parallel training the compute phase holds DDP's
gradient all-reduce and comm is a collective, so there a fast rank waits for the slow one and both
show the same time. Nor is the time a rank waited for a CPU that other processes held (StepTimer
measures it per phase, stalwart.agents.cpu_wait): on a host with more runnable processes than cores,
the ranks a collective releases together get a core one after the other: the one served last waits
a scheduler slice or two in its next phase (its optimizer step, its data, the rest of its step), on
one step in two, the same rank for tens of seconds at a time. A script that reports no phases has
only its step time (which synchronous training makes equal on every rank: then the pace and its
stack rounds, slowdowns.py, decide).

The relative score of a rank is its peers' median own work over its own (1.0: as fast as its
peers, 0.5: twice as slow), each side the median of its last samples; the individual score is its
recent own work against its own earlier median. The phase a straggler loses its time in names it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from statistics import median

from stalwart.store.records import PhaseTimes

OWN_WORK_PHASES = ("data", "optimizer", "other")
PHASE_CAUSES = {
    "data": "slow data loading",
    "optimizer": "slow optimizer step",
    "other": "slow compute or a throttled host (time outside the collectives)",
    "step": "slow step (the script times no phases)",
}


@dataclass(frozen=True)
class Sample:
    """One step of one rank: its own-work time split by phase (seconds)."""

    step: int
    own: Mapping[str, float]

    @property
    def total(self) -> float:
        return sum(self.own.values())


def own_work(
    phases: PhaseTimes | None, step_time: float | None, *, less_cpu_wait: bool = True
) -> dict[str, float] | None:
    """The own-work phases of one step, less the time each waited for a CPU (where the SDK says; not
    with `less_cpu_wait=False`, for which that wait is the machine's load to see), or the step time
    where the script times no phase."""
    if phases is not None and any(getattr(phases, p) is not None for p in ("data", "compute", "optimizer")):
        waits = (phases.cpu_wait or {}) if less_cpu_wait else {}
        return {p: max(0.0, float(getattr(phases, p) or 0.0) - waits.get(p, 0.0)) for p in OWN_WORK_PHASES}
    if step_time:
        return {"step": float(step_time)}
    return None


@dataclass(frozen=True)
class RankScore:
    rank: int
    relative: float  # peers' median own work / this rank's (1.0 with no peers)
    individual: float  # this rank's earlier median own work / its recent one (1.0 without history)
    excess: float  # seconds of own work per step over its peers' median
    phase: str  # where the excess is (the phase with the most of it)
    own: float  # its recent median own work (seconds)
    peers: float  # its peers' recent median own work (seconds)


def _median_phases(samples: Sequence[Sample]) -> dict[str, float]:
    keys = {k for s in samples for k in s.own}
    return {k: median(s.own.get(k, 0.0) for s in samples) for k in sorted(keys)}


def score_group(history: Mapping[int, Sequence[Sample]], recent: int, *, min_samples: int) -> dict[int, RankScore]:
    """Scores for the ranks of one peer group (ranks that do the same work: one data-parallel
    group), from each rank's samples, oldest first. A rank with fewer than `min_samples` recent
    samples is not scored, nor compared with."""
    windows = {r: list(islice(s, max(0, len(s) - recent), None)) for r, s in history.items() if len(s) >= min_samples}
    totals = {r: median(s.total for s in w) for r, w in windows.items()}
    phases = {r: _median_phases(w) for r, w in windows.items()}
    # Each rank's peers are the group less itself: sorted once, the median without one value is a
    # lookup (a group is a whole data-parallel dimension: 80,000 ranks at 10,000 nodes, where a
    # median over the others per rank cost O(G^2)).
    all_totals = sorted(totals.values())
    phase_keys = {k for p in phases.values() for k in p}
    all_phases = {k: sorted(p.get(k, 0.0) for p in phases.values()) for k in phase_keys}
    out: dict[int, RankScore] = {}
    for rank, own in totals.items():
        if len(totals) < 2:
            continue
        peers = median_without(all_totals, own)
        peer_phases = {k: median_without(all_phases[k], phases[rank][k]) for k in phases[rank]}
        by_phase = {k: phases[rank][k] - peer_phases[k] for k in phases[rank]}
        phase = max(by_phase, key=lambda k: by_phase[k])
        earlier = list(islice(history[rank], 0, max(0, len(history[rank]) - recent)))  # a deque has no slices
        before = median(s.total for s in earlier) if len(earlier) >= min_samples else own
        out[rank] = RankScore(
            rank=rank,
            relative=min(1.0, peers / own) if own > 0 else 1.0,
            individual=min(1.0, before / own) if own > 0 else 1.0,
            excess=own - peers,
            phase=phase,
            own=own,
            peers=peers,
        )
    return out


def median_without(ordered: Sequence[float], value: float) -> float:
    """The median of `ordered` (sorted, holding `value`) less one occurrence of `value`: what
    statistics.median gives for the same values, in O(log n)."""
    gone = bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(i: int) -> float:
        return ordered[i if i < gone else i + 1]

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2


def peer_groups(world: int, tensor: int = 1, context: int = 1, pipeline: int = 1) -> list[list[int]]:
    """A role's ranks (0-based, role-local) grouped by what they compute: same tensor, context and
    pipeline coordinate, each data-parallel replica once (rank = tp + TP * (cp + CP * (dp + DP * pp)))."""
    inner = tensor * context
    dp = world // (inner * pipeline)
    groups: list[list[int]] = []
    for pp in range(pipeline):
        for i in range(inner):
            groups.append([i + inner * (d + dp * pp) for d in range(dp)])
    return groups


@dataclass(frozen=True)
class Verdict:
    """A rank the scores single out: below the threshold and costing the job a share of its step."""

    score: RankScore
    cost: float  # its excess as a share of the job's median step time

    @property
    def cause(self) -> str:
        return PHASE_CAUSES.get(self.score.phase, self.score.phase)


def slow_ranks(
    scores: Mapping[int, RankScore], threshold: float, step_time: float, min_cost: float
) -> dict[int, Verdict]:
    """The ranks whose relative score is under `threshold` and whose excess own work costs the job
    at least `min_cost` of its median step time: a tiny phase that doubles (1 ms of data loading
    turned 2 ms) scores low and costs nothing."""
    out: dict[int, Verdict] = {}
    for rank, s in scores.items():
        cost = s.excess / step_time if step_time > 0 else 0.0
        if s.relative < threshold and cost >= min_cost:
            out[rank] = Verdict(s, cost)
    return out
