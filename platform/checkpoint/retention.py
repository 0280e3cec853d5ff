"""Which committed checkpoints to keep: the last N, plus every K-th step (a pure function)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RetentionPolicy(BaseModel):
    keep_last: int = Field(default=3, ge=1)
    keep_every: int = Field(default=0, ge=0, description="also keep steps divisible by this (0: none)")


def to_delete(committed_steps: list[int], policy: RetentionPolicy) -> list[int]:
    steps = sorted(set(committed_steps))
    keep = set(steps[-policy.keep_last :])
    if policy.keep_every:
        keep |= {s for s in steps if s % policy.keep_every == 0}
    return [s for s in steps if s not in keep]
