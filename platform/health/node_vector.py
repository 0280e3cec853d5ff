"""A compact per-node metric vector: what the heartbeat carries for metric-based diagnosis.

Minder-style diagnosis compares the same few numbers across nodes to find the outlier, so the
vector is small, flat and always the same shape; a value the node cannot measure is None.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from statistics import mean

from pydantic import Field

from stalwart.health.gpu_readings import GpuReading
from stalwart.health.host import HostReadings
from stalwart.health.network import NetReadings, error_deltas
from stalwart.store.records import PhaseTimes, Record, WorkerState, WorkerStatus


class NodeMetricVector(Record):
    node: str
    at: float = Field(default_factory=time.time)
    workers_running: int = 0
    step: int | None = None  # the slowest rank's step
    step_time_s: float | None = None  # mean over ranks of the last step time
    step_time_max_s: float | None = None
    tokens_per_second: float | None = None  # sum over ranks
    progress_age_s: float | None = None  # time since the least recent rank's last progress
    # Where the ranks' last steps went (the worker SDK's phase times): mean and max over the ranks.
    data_time_s: float | None = None  # waiting for the next batch
    data_time_max_s: float | None = None
    compute_time_s: float | None = None  # forward and backward
    compute_time_max_s: float | None = None
    optimizer_time_s: float | None = None
    optimizer_time_max_s: float | None = None
    comm_time_s: float | None = None  # blocked in communication outside forward and backward
    comm_time_max_s: float | None = None
    other_time_s: float | None = None  # step wall time no phase accounts for
    other_time_max_s: float | None = None
    # Each running rank's last step, by phase: diagnosis compares ranks as well as nodes, so a slow
    # rank is named among few nodes (two nodes have no "others") and apart from its victims.
    rank_phases: dict[int, PhaseTimes] = Field(default_factory=dict)
    gpu_count: int | None = None
    gpu_utilization_pct: float | None = None  # mean over GPUs
    gpu_temperature_c: float | None = None  # hottest GPU
    gpu_memory_used_pct: float | None = None  # mean over GPUs
    nic_error_delta: int | None = None  # error counters grown since the previous reading
    cpu_percent: float | None = None
    memory_percent: float | None = None


PHASE_NAMES = ("data", "compute", "optimizer", "comm", "other")  # stalwart.store.records.PhaseTimes


def _mean(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return mean(xs) if xs else None


def node_metric_vector(
    node: str,
    workers: Sequence[WorkerStatus],
    *,
    gpus: Sequence[GpuReading] | None = None,
    net_now: NetReadings | None = None,
    net_previous: NetReadings | None = None,
    host: HostReadings | None = None,
    now: float | None = None,
) -> NodeMetricVector:
    now = time.time() if now is None else now
    running = [w for w in workers if w.state is WorkerState.RUNNING]
    steps = [w.step for w in running if w.step is not None]
    step_times = [w.step_time for w in running if w.step_time is not None]
    tps = [w.tokens_per_second for w in running if w.tokens_per_second is not None]
    progress = [w.last_progress_at for w in running if w.last_progress_at is not None]
    vector = NodeMetricVector(
        node=node,
        at=now,
        workers_running=len(running),
        step=min(steps) if steps else None,
        step_time_s=_mean(step_times),
        step_time_max_s=max(step_times) if step_times else None,
        tokens_per_second=sum(tps) if tps else None,
        progress_age_s=now - min(progress) if progress else None,
    )
    for phase in PHASE_NAMES:
        values = [v for w in running if w.phases is not None and (v := getattr(w.phases, phase)) is not None]
        if values:
            setattr(vector, f"{phase}_time_s", mean(values))
            setattr(vector, f"{phase}_time_max_s", max(values))
    vector.rank_phases = {w.rank: w.phases for w in running if w.phases is not None}
    if gpus is not None:
        responding = [g for g in gpus if g.responding]
        temps = [g.temperature_c for g in responding if g.temperature_c is not None]
        vector.gpu_count = len(responding)
        vector.gpu_utilization_pct = _mean([g.utilization_gpu_pct for g in responding])
        vector.gpu_temperature_c = max(temps) if temps else None
        vector.gpu_memory_used_pct = _mean(
            [
                100.0 * g.memory_used_mib / g.memory_total_mib
                for g in responding
                if g.memory_used_mib is not None and g.memory_total_mib
            ]
        )
    if net_now is not None and net_previous is not None:
        vector.nic_error_delta = sum(error_deltas(net_now, net_previous).values())
    if host is not None:
        vector.cpu_percent = host.cpu_percent
        vector.memory_percent = host.memory_percent
    return vector
