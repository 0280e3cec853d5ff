"""The control plane's detection and decision times at the simulated job's size, from the scale
harness (bench/bench_control_plane.py, issue 23), which writes docs/control-plane-scale.json.

The recovery benchmark (measured.py) times detection on a job of a few nodes; what a controller
needs on top of that at 1,200 nodes is what the scale harness measures: the eviction decision after
a lost node's lease expires, a hang's detection beyond its timeout, and the tick. One run (a label)
is used for all three, the newest unless one is named (the newest whose sizes span the job's, if
any); each figure is interpolated linearly in the node count between the two measured sizes around
the job's. A figure that cannot be had that way
(the file or the label is missing, the job's size is above every measured size, or a size next to
it failed: the phase did not complete, or the job never ran) falls back to the small-job figures,
i.e. nothing is added, and the note says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from stalwart.simulator.measured import REPO, shown_path

CONTROL_PLANE_PATH = REPO / "docs" / "control-plane-scale.json"


class ControlPlaneAtScale(BaseModel):
    """Seconds the control plane adds at `nodes` nodes (0 where the small-job figures stand)."""

    model_config = ConfigDict(frozen=True)

    nodes: int
    label: str | None = None
    source: str = "none"
    lease_decision_seconds: float = Field(0.0, ge=0, description="Lease expiry to the eviction decision.")
    hang_beyond_timeout_seconds: float = Field(0.0, ge=0, description="Hang detection past its timeout.")
    tick_p50_seconds: float | None = None
    tick_p99_seconds: float | None = None
    notes: dict[str, str] = {}  # per figure: how it was obtained, or why it fell back


# Where each figure is in one size's entry of the harness's output, and what makes it usable.
def _lease_decision(size: dict[str, Any]) -> float | None:
    kill = (size.get("phases") or {}).get("kill") or {}
    return _number(kill.get("expiry_to_decision_s")) if kill.get("completed") else None


def _hang_beyond(size: dict[str, Any]) -> float | None:
    hang = (size.get("phases") or {}).get("hang") or {}
    return _number(hang.get("beyond_timeout_s")) if hang.get("completed") else None


def _steady(size: dict[str, Any]) -> dict[str, Any]:
    """The controller's figures of the steady window, only when the job ran through it (a size that
    never started measures what was left of it, not a steady state of that many nodes)."""
    steady = (size.get("phases") or {}).get("steady") or {}
    return (steady.get("controller") or {}) if steady.get("job_phase") == "Running" else {}


def _tick_p50(size: dict[str, Any]) -> float | None:
    return _number(_steady(size).get("tick_p50_s"))


def _tick_p99(size: dict[str, Any]) -> float | None:
    return _number(_steady(size).get("tick_p99_s"))


FIGURES = {
    "lease_decision_seconds": _lease_decision,
    "hang_beyond_timeout_seconds": _hang_beyond,
    "tick_p50_seconds": _tick_p50,
    "tick_p99_seconds": _tick_p99,
}


ADDED = ("lease_decision_seconds", "hang_beyond_timeout_seconds")  # the ticks are shown, not added


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def interpolate(points: dict[int, float | None], nodes: int) -> tuple[float | None, str]:
    """The figure at `nodes` from {measured size: figure, None where it failed}, and how it was had."""
    if not points:
        return None, "not measured"
    sizes = sorted(points)
    if nodes in points:
        value = points[nodes]
        return (value, f"measured at {nodes:,} nodes") if value is not None else (None, f"failed at {nodes:,} nodes")
    below = [n for n in sizes if n < nodes]
    above = [n for n in sizes if n > nodes]
    if not above:
        return None, f"not measured at or above {nodes:,} nodes (largest size {sizes[-1]:,})"
    if not below:
        value = points[above[0]]
        if value is None:
            return None, f"failed at {above[0]:,} nodes, the smallest size"
        return value, f"the smallest measured size's ({above[0]:,} nodes)"
    lo, hi = below[-1], above[0]
    failed = [n for n in (lo, hi) if points[n] is None]
    if failed:
        return None, "failed at " + " and ".join(f"{n:,}" for n in failed) + " nodes"
    low, high = points[lo], points[hi]
    assert low is not None and high is not None
    value = low + (high - low) * (nodes - lo) / (hi - lo)
    return value, f"interpolated between {lo:,} and {hi:,} nodes"


def newest_label(runs: dict[str, Any], nodes: int | None = None) -> str | None:
    """The run measured last (its `when`), which is the design as it is now; with `nodes`, the last
    of those whose sizes span it, if any (a run of one size interpolates nothing)."""
    if not runs:
        return None

    def spans(label: str) -> bool:
        sizes = [s.get("nodes") for s in (runs[label] or {}).get("sizes") or [] if isinstance(s.get("nodes"), int)]
        return nodes is not None and bool(sizes) and min(sizes) <= nodes <= max(sizes)

    candidates = [label for label in runs if spans(label)] or list(runs)
    return max(candidates, key=lambda label: (str((runs[label] or {}).get("when") or ""), label))


def load_control_plane(path: Path | str | None = None, *, nodes: int, label: str | None = None) -> ControlPlaneAtScale:
    """The control plane's figures at `nodes` nodes from the harness's file (see the module doc)."""
    p = Path(path) if path is not None else CONTROL_PLANE_PATH
    fallback = "the small-job figures (nothing added)"
    if not p.is_file():
        why = f"no {p.name}: {fallback}"
        return ControlPlaneAtScale(nodes=nodes, notes=dict.fromkeys(FIGURES, why))
    try:
        runs = json.loads(p.read_text()).get("runs") or {}
    except (ValueError, AttributeError) as exc:
        raise ValueError(f"{p}: not the scale harness's output ({exc})") from None
    chosen = label if label is not None else newest_label(runs, nodes)
    run = runs.get(chosen) if chosen is not None else None
    if run is None:
        why = f"no run labelled {chosen!r} in {p.name} (it has {sorted(runs)}): {fallback}"
        return ControlPlaneAtScale(nodes=nodes, label=chosen, source=shown_path(p), notes=dict.fromkeys(FIGURES, why))
    sizes = [s for s in run.get("sizes") or [] if isinstance(s.get("nodes"), int)]
    values: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    for name, read in FIGURES.items():
        value, how = interpolate({s["nodes"]: read(s) for s in sizes}, nodes)
        values[name] = value
        missing = fallback if name in ADDED else "none"
        notes[name] = f"{how} (label {chosen})" + ("" if value is not None else f": {missing}")
    return ControlPlaneAtScale(
        nodes=nodes,
        label=chosen,
        source=shown_path(p),
        lease_decision_seconds=values["lease_decision_seconds"] or 0.0,
        hang_beyond_timeout_seconds=values["hang_beyond_timeout_seconds"] or 0.0,
        tick_p50_seconds=values["tick_p50_seconds"],
        tick_p99_seconds=values["tick_p99_seconds"],
        notes=notes,
    )
