"""A job's throughput and MFU from its ranks' last steps (pure): what /metrics, `stalwart status`,
the console and the MFU-decline detector all show, computed one way."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stalwart.spec import TrainingJobSpec
from stalwart.store.records import WorkerStatus


@dataclass(frozen=True)
class Throughput:
    tokens_per_second: float | None  # the running ranks' sum (None: no rank reports tokens)
    steps_per_second: float | None  # 1 / the running ranks' median step time
    flops_per_second: float | None  # the model FLOP/s the running ranks report, summed
    mfu: float | None  # flops_per_second over the ranks' peak (the roles' peakFlopsPerWorker)

    @property
    def pace(self) -> float | None:
        """What a decline is measured on: tokens/s where reported, else steps/s."""
        return self.tokens_per_second if self.tokens_per_second is not None else self.steps_per_second


def job_throughput(workers: Sequence[WorkerStatus], spec: TrainingJobSpec | None) -> Throughput:
    running = [w for w in workers if w.exit_code is None and w.step is not None]
    tokens = [w.tokens_per_second for w in running if w.tokens_per_second]
    times = sorted(w.step_time for w in running if w.step_time)
    flops = [(w.rank, w.flops_per_second) for w in running if w.flops_per_second]
    peak = 0.0
    if spec is not None and flops:
        peaks = rank_peaks(spec)
        peak = sum(peaks.get(rank) or 0.0 for rank, _ in flops)
        if any(not peaks.get(rank) for rank, _ in flops):
            peak = 0.0  # a rank with no known peak: no MFU rather than a wrong one
    total_flops = sum(f for _, f in flops) if flops else None
    return Throughput(
        tokens_per_second=sum(tokens) if tokens else None,
        steps_per_second=1.0 / times[len(times) // 2] if times else None,
        flops_per_second=total_flops,
        mfu=total_flops / peak if total_flops is not None and peak > 0 else None,
    )


def rank_peaks(spec: TrainingJobSpec) -> dict[int, float | None]:
    """Each job-wide rank's peak FLOP/s, from its role (roles in spec order, contiguous ranks)."""
    out: dict[int, float | None] = {}
    rank = 0
    for role in spec.roles:
        for _ in range(role.world_size):
            out[rank] = role.peak_flops_per_worker
            rank += 1
    return out
