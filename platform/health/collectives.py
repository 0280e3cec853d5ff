"""Collective health checks, run inside each participating process.

All-to-all within a node and all-reduce / all-gather between neighbouring nodes, each timed (a
tiny op for latency, a sized op for bandwidth) and checked bitwise: every contribution is a small
integer pattern computed from the sender's rank, so the exact expected result is known locally.
Bandwidth is bus bandwidth as nccl-tests reports it, so numbers compare with theirs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from statistics import median

import torch
import torch.distributed as dist

from stalwart.health.collective_records import CheckResult

ITERS = 3


def pattern(numel: int, src: int, dst: int = 0, device: torch.device | str = "cpu") -> torch.Tensor:
    """A rank's exact contribution: small integers, so sums over many ranks stay exact in float32."""
    idx = torch.arange(numel, dtype=torch.int64)
    return ((idx % 251) + 1 + 3 * src + 7 * dst).to(torch.float32).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(op: Callable[[], None], device: torch.device, iters: int = ITERS) -> float:
    times = []
    for _ in range(iters):
        _sync(device)
        t0 = time.perf_counter()
        op()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return median(times)


def _mismatches(got: torch.Tensor, expected: torch.Tensor) -> int:
    return int((got != expected).sum().item())


def all_reduce_check(
    group: dist.ProcessGroup, members: Sequence[int], rank: int, numel: int, device: torch.device
) -> CheckResult:
    n = len(members)
    expected = sum(pattern(numel, m, device=device) for m in members)
    assert isinstance(expected, torch.Tensor)
    tiny = pattern(1, rank, device=device)
    latency = _timed(lambda: dist.all_reduce(tiny, group=group), device)
    checked = pattern(numel, rank, device=device)
    dist.all_reduce(checked, group=group)  # the warm-up, whose result is checked
    bad = _mismatches(checked, expected)
    # Timed in place on one buffer, as nccl-tests does (the values grow; only the time counts). A
    # fresh pattern per op timed building it on the host and copying it to the GPU: 73 ms per 64 MiB
    # op on an H100, where an all-gather of the same size took 0.12 ms (docs/gpu.md).
    buffer = pattern(numel, rank, device=device)
    seconds = _timed(lambda: dist.all_reduce(buffer, group=group), device)
    nbytes = numel * 4
    return CheckResult(
        name="all_reduce",
        group=list(members),
        passed=bad == 0,
        numel=numel,
        latency_s=latency,
        seconds_per_op=seconds,
        bus_bandwidth_gbps=nbytes * 2 * (n - 1) / n / seconds / 1e9,
        mismatches=bad,
    )


def all_gather_check(
    group: dist.ProcessGroup, members: Sequence[int], rank: int, numel: int, device: torch.device
) -> CheckResult:
    n = len(members)
    mine = pattern(numel, rank, device=device)
    outs = [torch.empty_like(mine) for _ in members]
    tiny_outs = [torch.empty(1, device=device) for _ in members]
    tiny = pattern(1, rank, device=device)
    latency = _timed(lambda: dist.all_gather(tiny_outs, tiny, group=group), device)
    dist.all_gather(outs, mine, group=group)  # warm-up
    seconds = _timed(lambda: dist.all_gather(outs, mine, group=group), device)
    bad = sum(_mismatches(outs[i], pattern(numel, m, device=device)) for i, m in enumerate(members))
    nbytes = numel * 4
    return CheckResult(
        name="all_gather",
        group=list(members),
        passed=bad == 0,
        numel=numel,
        latency_s=latency,
        seconds_per_op=seconds,
        bus_bandwidth_gbps=nbytes * (n - 1) / seconds / 1e9,
        mismatches=bad,
    )


def all_to_all_check(
    group: dist.ProcessGroup, members: Sequence[int], rank: int, numel: int, device: torch.device
) -> CheckResult:
    n = len(members)
    chunk = max(1, numel // n)
    send = torch.cat([pattern(chunk, rank, dst, device=device) for dst in members])
    recv = torch.empty_like(send)
    tiny_send = torch.cat([pattern(1, rank, dst, device=device) for dst in members])
    tiny_recv = torch.empty_like(tiny_send)
    latency = _timed(lambda: dist.all_to_all_single(tiny_recv, tiny_send, group=group), device)
    dist.all_to_all_single(recv, send, group=group)  # warm-up
    seconds = _timed(lambda: dist.all_to_all_single(recv, send, group=group), device)
    expected = torch.cat([pattern(chunk, src, rank, device=device) for src in members])
    bad = _mismatches(recv, expected)
    nbytes = chunk * n * 4
    return CheckResult(
        name="all_to_all",
        group=list(members),
        passed=bad == 0,
        numel=chunk * n,
        latency_s=latency,
        seconds_per_op=seconds,
        bus_bandwidth_gbps=nbytes * (n - 1) / n / seconds / 1e9,
        mismatches=bad,
    )


def node_groups(nodes: int, procs_per_node: int) -> list[list[int]]:
    """The ranks of each node (rank = node * procs_per_node + local_rank, as torchrun assigns them)."""
    return [list(range(n * procs_per_node, (n + 1) * procs_per_node)) for n in range(nodes)]


def neighbour_pairs(nodes: int) -> list[tuple[int, int]]:
    """Each node with the next one, in a ring: (0,1), (1,2), ..., (N-1,0); a single pair for two nodes."""
    if nodes < 2:
        return []
    pairs = [(n, (n + 1) % nodes) for n in range(nodes)]
    unique: list[tuple[int, int]] = []
    for a, b in pairs:
        key = (min(a, b), max(a, b))
        if key not in unique:
            unique.append(key)
    return unique
