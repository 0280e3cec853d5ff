"""One participant of the collective health check: `python -m stalwart.health.collective_worker`.

Reads the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and STALWART_HEALTH_* settings, runs the checks, and writes its RankReport to
STALWART_HEALTH_RESULT after every phase. Fault injection for tests:
STALWART_FAULT_COLLECTIVE_HANG=1 makes this rank never join the collectives (it waits, bounded,
until it is stopped), STALWART_FAULT_CORRUPT_COMPUTE=1 corrupts its compute-check result and
STALWART_FAULT_SLOW_START_SECONDS=N makes it reach the rendezvous N seconds late.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from stalwart.health.collective_records import (
    BACKEND_ENV,
    NUMEL_ENV,
    RENDEZVOUS_TIMEOUT_ENV,
    RESULT_ENV,
    TIMEOUT_ENV,
    CheckResult,
    RankReport,
)
from stalwart.health.collectives import (
    all_gather_check,
    all_reduce_check,
    all_to_all_check,
    neighbour_pairs,
    node_groups,
)
from stalwart.health.compute_check import compute_digest, disagreeing_ranks
from stalwart.net import bound_tcp_store

HANG_ENV = "STALWART_FAULT_COLLECTIVE_HANG"
SLOW_START_ENV = "STALWART_FAULT_SLOW_START_SECONDS"  # start this many seconds late (at most 60)
HANG_LIMIT_S = 600  # a "hung" rank gives up after this long, should nobody stop it


def _backend_and_device(local_rank: int) -> tuple[str, torch.device]:
    wanted = os.environ.get(BACKEND_ENV, "auto")
    if wanted == "nccl" or (wanted == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def _run_check(
    report: RankReport, path: Path, name: str, members: list[int], fn: Callable[..., CheckResult], *args: object
) -> None:
    report.enter(name, path)
    try:
        report.checks.append(fn(*args))
    except Exception as exc:
        report.checks.append(CheckResult(name=name, group=members, passed=False, error=f"{type(exc).__name__}: {exc}"))
    report.write(path)


# 64M float32 elements (256 MiB): where nccl-tests' bus bandwidth reaches its plateau on NVLink and
# InfiniBand, so a degraded link shows.
GPU_NUMEL = 1 << 26


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = world // per_node
    path = Path(os.environ[RESULT_ENV])
    numel = int(os.environ.get(NUMEL_ENV, str(1 << 16)))
    timeout = float(os.environ.get(TIMEOUT_ENV, "30"))
    rendezvous_timeout = float(os.environ.get(RENDEZVOUS_TIMEOUT_ENV, "300"))
    backend, device = _backend_and_device(local_rank)
    if device.type == "cuda":
        numel = max(numel, GPU_NUMEL)  # a few hundred KiB measure latency, not NVLink or InfiniBand
    report = RankReport(
        rank=rank, node=rank // per_node, local_rank=local_rank, pid=os.getpid(), backend=backend, device=str(device)
    )
    report.write(path)
    time.sleep(min(60.0, float(os.environ.get(SLOW_START_ENV, "0"))))
    try:
        report.enter("rendezvous", path)
        limit = datetime.timedelta(seconds=timeout)
        # Rendezvous waits for the slowest process to start (seconds on a loaded host); the short
        # collective timeout applies from then on, so a hung peer is noticed quickly.
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        store_timeout = datetime.timedelta(seconds=rendezvous_timeout)
        store = (  # rank 0 serves it on MASTER_ADDR only, not on every interface (docs/security.md)
            bound_tcp_store(addr, port, world, store_timeout, wait_for_workers=True)
            if rank == 0
            else dist.TCPStore(addr, port, world, False, timeout=store_timeout)
        )
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=limit)
        # Every group gets the same timeout: new_group's default is the 30-minute one.
        intra = [(g, dist.new_group(g, timeout=limit)) for g in node_groups(nodes, per_node) if len(g) > 1]
        pairs = []
        for a, b in neighbour_pairs(nodes):
            members = sorted(node_groups(nodes, per_node)[a] + node_groups(nodes, per_node)[b])
            pairs.append((members, dist.new_group(members, timeout=limit)))
        report.enter("joined", path)
        if os.environ.get(HANG_ENV) == "1":
            for _ in range(HANG_LIMIT_S * 10):  # bounded: "never joins" as far as any timeout cares
                time.sleep(0.1)
            return 3
        for members, group in intra:
            if rank in members:
                _run_check(report, path, "all_to_all", members, all_to_all_check, group, members, rank, numel, device)
        for members, group in pairs:
            if rank in members:
                _run_check(report, path, "all_reduce", members, all_reduce_check, group, members, rank, numel, device)
                _run_check(report, path, "all_gather", members, all_gather_check, group, members, rank, numel, device)
        report.enter("compute", path)
        report.compute_digest = compute_digest(device)
        mine = torch.tensor(list(bytes.fromhex(report.compute_digest)), dtype=torch.uint8, device=device)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        digests = {r: bytes(t.cpu().tolist()).hex() for r, t in enumerate(gathered)}
        report.compute_mismatch_ranks = disagreeing_ranks(digests)
        report.enter("done", path)
    except Exception as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    report.finished = True
    report.write(path)
    if dist.is_initialized() and report.error is None and all(c.passed for c in report.checks):
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a process group whose peer hung can block its destructor, and the
    # report is already written.
    os._exit(code)
