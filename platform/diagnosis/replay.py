"""Dual-phase replay: find a faulty machine that no check catches by replaying the job on groups.

The last rung of the ladder (DESIGN.md, failure handling 6). The job's machines form a grid: one
machine per (pipeline stage, data-parallel replica), TP inside the machine, so that
`machines[s * dp + r]` hosts stage s of replica r (Megatron's rank order with one TP group per
machine). Every replay group must be a job that can run: whole pipelines, PP machines each, at a
smaller data-parallel size. The plan splits the machines twice, into horizontal and into vertical
groups, so that a horizontal and a vertical group share at most one machine. Replay every group of
one phase, then of the other; with one faulty machine, exactly one group of each phase fails and
the two intersect in it.

Two layouts:

- DP >= PP ("diagonal"): horizontal group j is g consecutive replicas, whole (g the largest divisor
  of DP that leaves at least PP groups); vertical group k is one pipeline assembled diagonally,
  stage s taken from replica (k + s*g) mod DP, so its PP machines sit in PP different horizontal
  groups.
- DP < PP ("stages"): a diagonal cannot avoid meeting a horizontal group twice, so spare machines
  known to be good (warm standbys) fill in: horizontal group r is replica r's pipeline; vertical
  group s is the DP machines of stage s plus PP - DP spares. Needs PP - DP spares (the vertical
  groups run one after another, or take distinct spares).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Phase = Literal["horizontal", "vertical"]


class ReplayInconclusive(ValueError):
    """The replay results do not single out one machine (no group failed, or several did)."""


class ReplayGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    phase: Phase
    pipelines: list[list[str]]  # each is one pipeline, machine of stage 0 first; DP = len(pipelines)
    spares: list[str] = []  # known-good fillers among them

    @property
    def machines(self) -> list[str]:
        return [m for p in self.pipelines for m in p]

    @property
    def dp(self) -> int:
        return len(self.pipelines)


class ReplayPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pp: int = Field(ge=1)
    dp: int = Field(ge=1)
    scheme: Literal["diagonal", "stages"]
    machines: list[str]  # stage-major: machines[s * dp + r]
    horizontal: list[ReplayGroup]
    vertical: list[ReplayGroup]

    def groups(self, phase: Phase) -> list[ReplayGroup]:
        return self.horizontal if phase == "horizontal" else self.vertical


def plan_replay(pp: int, dp: int, machines: Sequence[str], spares: Sequence[str] = ()) -> ReplayPlan:
    """Split PP x DP machines into horizontal and vertical replay groups (see the module doc)."""
    if pp < 1 or dp < 1:
        raise ValueError(f"PP and DP must be at least 1, got PP={pp} DP={dp}")
    if len(machines) != pp * dp:
        raise ValueError(f"expected PP x DP = {pp * dp} machines, got {len(machines)}")
    if len(set(machines)) != len(machines):
        raise ValueError("machine names must be unique")
    overlap = set(spares) & set(machines)
    if overlap:
        raise ValueError(f"spares must not be among the job's machines: {sorted(overlap)[:5]}")

    def at(stage: int, replica: int) -> str:
        return machines[stage * dp + replica]

    if dp >= pp:
        g = max(d for d in range(1, dp + 1) if dp % d == 0 and dp // d >= pp)
        h_groups = dp // g
        horizontal = [
            ReplayGroup(
                id=f"h{j}",
                phase="horizontal",
                pipelines=[[at(s, r) for s in range(pp)] for r in range(j * g, (j + 1) * g)],
            )
            for j in range(h_groups)
        ]
        vertical = [
            ReplayGroup(id=f"v{k}", phase="vertical", pipelines=[[at(s, (k + s * g) % dp) for s in range(pp)]])
            for k in range(dp)
        ]
        return ReplayPlan(
            pp=pp, dp=dp, scheme="diagonal", machines=list(machines), horizontal=horizontal, vertical=vertical
        )
    need = pp - dp
    if len(spares) < need:
        raise ValueError(
            f"dual-phase replay with DP={dp} < PP={pp} needs {need} spare machine(s) known to be "
            f"good (warm standbys) to fill the vertical pipelines; got {len(spares)}"
        )
    fill = list(spares[:need])
    horizontal = [
        ReplayGroup(id=f"h{r}", phase="horizontal", pipelines=[[at(s, r) for s in range(pp)]]) for r in range(dp)
    ]
    vertical = [
        ReplayGroup(id=f"v{s}", phase="vertical", pipelines=[[at(s, r) for r in range(dp)] + fill], spares=fill)
        for s in range(pp)
    ]
    return ReplayPlan(pp=pp, dp=dp, scheme="stages", machines=list(machines), horizontal=horizontal, vertical=vertical)


def _failed(plan: ReplayPlan, phase: Phase, failed: Sequence[int | str]) -> ReplayGroup:
    groups = plan.groups(phase)
    by_id = {g.id: g for g in groups}
    picked: list[ReplayGroup] = []
    for f in failed:
        if isinstance(f, int):
            if not 0 <= f < len(groups):
                raise ValueError(f"{phase} group index {f} is outside 0..{len(groups) - 1}")
            picked.append(groups[f])
        elif f in by_id:
            picked.append(by_id[f])
        else:
            raise ValueError(f"no {phase} group {f!r}")
    unique = {g.id: g for g in picked}
    if len(unique) != 1:
        raise ReplayInconclusive(
            f"{len(unique)} {phase} groups failed; dual-phase replay singles out one faulty "
            "machine when exactly one group of each phase fails"
        )
    return next(iter(unique.values()))


def locate(plan: ReplayPlan, horizontal_failed: Sequence[int | str], vertical_failed: Sequence[int | str]) -> str:
    """The machine in both failing groups (given as indices or ids), spares excluded."""
    h = _failed(plan, "horizontal", horizontal_failed)
    v = _failed(plan, "vertical", vertical_failed)
    return common_machine(h.id, h.machines, v.id, v.machines, [*h.spares, *v.spares])


def common_machine(
    h_id: str, h_machines: Sequence[str], v_id: str, v_machines: Sequence[str], spares: Sequence[str] = ()
) -> str:
    """The one machine a failing horizontal and a failing vertical group share (spares excluded)."""
    common = (set(h_machines) & set(v_machines)) - set(spares)
    if len(common) != 1:
        raise ReplayInconclusive(
            f"groups {h_id} and {v_id} share {len(common)} machines; the replay results are "
            "inconsistent with a single faulty machine"
        )
    return common.pop()
