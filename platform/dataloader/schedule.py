"""Curriculum schedules: weights quantized to integers (exact arithmetic), and ramp helpers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stalwart.dataloader.config import Milestone

WEIGHT_QUANTUM = 1 << 16  # weights are exact multiples of 1/65536 of the total


@dataclass(frozen=True)
class Segment:
    """Positions [start, next segment's start) mix the sources with these integer weights."""

    start: int
    weights: tuple[int, ...]


def quantize(weights: Sequence[float]) -> tuple[int, ...]:
    """Integer weights summing to about WEIGHT_QUANTUM; a positive weight never rounds to zero."""
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("at least one weight must be positive")
    return tuple(0 if w <= 0 else max(1, round(w / total * WEIGHT_QUANTUM)) for w in weights)


def build_segments(segments: Sequence[tuple[int, Sequence[float]]]) -> list[Segment]:
    return [Segment(start, quantize(weights)) for start, weights in segments]


def linear_ramp(
    start_weights: dict[str, float],
    end_weights: dict[str, float],
    start_sample: int,
    end_sample: int,
    pieces: int = 16,
) -> list[Milestone]:
    """Milestones that move the weights linearly from start to end in `pieces` constant steps."""
    if end_sample <= start_sample or pieces < 1:
        raise ValueError("need end_sample > start_sample and pieces >= 1")
    names = sorted(set(start_weights) | set(end_weights))
    out = []
    for i in range(pieces + 1):
        frac = i / pieces
        at = start_sample + (end_sample - start_sample) * i // pieces
        weights = {n: (1 - frac) * start_weights.get(n, 0.0) + frac * end_weights.get(n, 0.0) for n in names}
        out.append(Milestone(at_sample=at, weights=weights))
    return out
