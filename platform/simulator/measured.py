"""The recovery times measured on this machine by the recovery benchmark, or documented defaults.

The benchmark (bench/, issue 7) writes docs/recovery-measured.json. Until it has run, the
simulator uses the defaults below, and every report says which of the two it used.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from stalwart.spec.model import FailureEvent

REPO = Path(__file__).resolve().parents[2]
MEASURED_PATH = REPO / "docs" / "recovery-measured.json"


class MeasuredRecovery(BaseModel):
    """Recovery components measured end to end on one machine with a tiny model (seconds)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    hot_swap_seconds: float = Field(10.0, gt=0, description="Failure-to-first-step with a warm standby.")
    requeue_seconds: float = Field(
        50.0, gt=0, description="Every process relaunched and the checkpoint loaded from storage."
    )
    detect_seconds: dict[FailureEvent, float] = Field(
        default_factory=lambda: {
            FailureEvent.WORKER_CRASH: 1.0,  # the agent sees the exit on its next poll
            FailureEvent.LOST_NODE: 6.0,  # lease TTL 5 s + one heartbeat
            FailureEvent.HANG: 65.0,  # the 60 s hang-timeout floor + stack capture
            FailureEvent.NAN_LOSS: 1.0,  # the next progress report carries the NaN
        }
    )
    # What the local hang detection waited before capturing stacks: the rest of the measured Hang
    # latency is stack capture and aggregation. Tiny local steps put the timeout at its floor.
    hang_timeout_seconds: float = Field(60.0, gt=0)
    checkpoint_stall_seconds: float = Field(
        0.103, ge=0, description="Blocking part of one in-memory checkpoint save, slowest rank."
    )
    checkpoint_bytes_per_rank: float = Field(
        1.07e9 / 4, gt=0, description="State each rank staged in that measurement."
    )
    machine: str = "defaults (the recovery benchmark has not run; see docs/simulator.md)"
    source: str = "defaults"

    def detect(self, event: FailureEvent) -> float:
        """Measured detection latency; a machine fault is seen as fast as a crash (a probe or the
        worker's own exit with an Xid signature), a loss spike as fast as a NaN."""
        alias = {
            FailureEvent.MACHINE_FAULT: FailureEvent.WORKER_CRASH,
            FailureEvent.USER_CODE_ERROR: FailureEvent.WORKER_CRASH,
            FailureEvent.LOSS_SPIKE: FailureEvent.NAN_LOSS,
        }
        key = event if event in self.detect_seconds else alias.get(event, FailureEvent.WORKER_CRASH)
        return self.detect_seconds.get(key, self.detect_seconds.get(FailureEvent.WORKER_CRASH, 1.0))

    @property
    def stack_capture_seconds(self) -> float:
        """Measured hang latency beyond the timeout: capture, group and blame the stacks."""
        return max(0.0, self.detect(FailureEvent.HANG) - self.hang_timeout_seconds)

    @property
    def staging_bytes_per_second(self) -> float:
        """How fast a checkpoint's blocking part copied state here (bytes per second of stall)."""
        if self.checkpoint_stall_seconds <= 0:
            return float("inf")
        return self.checkpoint_bytes_per_rank / self.checkpoint_stall_seconds


# The benchmark's default (defaults: the checkpoint benchmark's measured 0.103 s stall for
# 1.07 GB over 4 ranks, docs/checkpoint-benchmark.md; the rest is what the local configuration
# implies: 1 s heartbeats, 5 s lease TTL, 60 s hang floor).
DEFAULTS = MeasuredRecovery()


def shown_path(path: Path) -> str:
    """A file as the docs name it: relative to the repository when it is in it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def load_measured(path: Path | str | None = None) -> MeasuredRecovery:
    """The benchmark's measurements when its file exists, the labeled defaults otherwise."""
    p = Path(path) if path is not None else MEASURED_PATH
    if not p.is_file():
        return DEFAULTS
    raw = json.loads(p.read_text())
    detect = {
        FailureEvent(k): float(v)
        for k, v in (raw.get("detect_seconds") or {}).items()
        if k in FailureEvent._value2member_map_
    }
    merged = {**raw, "detect_seconds": {**DEFAULTS.detect_seconds, **detect}}
    merged.setdefault("source", shown_path(p))
    if "machine" not in raw:
        merged["machine"] = "unspecified (from " + p.name + ")"
    return MeasuredRecovery.model_validate(merged)
