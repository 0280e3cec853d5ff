"""The per-node metric vector for heartbeats."""

from __future__ import annotations

from support.paths import REPO

from stalwart.health.network import read_net_sysfs
from stalwart.health.node_vector import NodeMetricVector, node_metric_vector
from stalwart.health.nvidia_smi import parse_nvidia_smi_q
from stalwart.store.records import WorkerState, WorkerStatus

DATA = REPO / "tests" / "data" / "health"


def worker(rank: int, **kw: object) -> WorkerStatus:
    return WorkerStatus(local_rank=rank, rank=rank, pid=100 + rank, state=WorkerState.RUNNING, started_at=0.0, **kw)  # type: ignore[arg-type]


def test_the_vector_summarizes_ranks_gpus_network_and_host() -> None:
    workers = [
        worker(0, step=10, step_time=0.5, tokens_per_second=1000.0, last_progress_at=95.0),
        worker(1, step=9, step_time=0.7, tokens_per_second=800.0, last_progress_at=90.0),
        WorkerStatus(local_rank=2, rank=2, pid=3, state=WorkerState.EXITED, exit_code=1, started_at=0.0, step=3),
    ]
    gpus = parse_nvidia_smi_q((DATA / "nvidia-smi" / "a100-sxm4-40gb-two-of-eight.txt").read_text()).gpus
    net = read_net_sysfs(DATA / "sysfs" / "healthy")
    v = node_metric_vector("node-1", workers, gpus=gpus, net_now=net, net_previous=net, now=100.0)
    assert (v.workers_running, v.step, v.step_time_s, v.step_time_max_s) == (2, 9, 0.6, 0.7)
    assert v.tokens_per_second == 1800.0 and v.progress_age_s == 10.0
    assert (v.gpu_count, v.gpu_temperature_c, v.gpu_utilization_pct, v.gpu_memory_used_pct) == (2, 41.0, 0.0, 0.0)
    assert v.nic_error_delta == 0 and v.cpu_percent is None
    assert NodeMetricVector.loads(v.dumps()) == v


def test_without_measurements_the_vector_says_none() -> None:
    v = node_metric_vector("node-0", [], now=1.0)
    assert v.workers_running == 0 and v.step is None and v.gpu_count is None and v.nic_error_delta is None
