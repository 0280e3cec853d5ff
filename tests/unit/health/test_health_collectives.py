"""Collective and compute checks as real processes on loopback (gloo here, NCCL on GPUs)."""

from __future__ import annotations

import math

import pytest
import torch

from stalwart.health.collective_records import CheckResult, NodeVerdict, RankReport
from stalwart.health.collective_runner import judge
from stalwart.health.collectives import neighbour_pairs, node_groups, pattern
from stalwart.health.compute_check import (
    BATCH,
    IN,
    LR,
    OUT,
    compute_digest,
    compute_step,
    disagreeing_ranks,
    fixed,
    reference_model,
)

# Generous limits: they bound a broken run, they are not what a passing run takes. The hang test
# uses a short collective timeout so the hung rank's peer gives up quickly.
TIMEOUT = 120.0
COLLECTIVE_TIMEOUT = 15.0
HANG_COLLECTIVE_TIMEOUT = 2.0


def test_judge_blames_both_ends_of_a_corrupted_transfer() -> None:
    def rank(r: int, mismatches: int) -> RankReport:
        check = CheckResult(name="all_reduce", group=[0, 1], passed=mismatches == 0, mismatches=mismatches)
        return RankReport(
            rank=r, node=r, local_rank=0, phase="done", finished=True, checks=[check], compute_digest="ab"
        )

    verdicts = judge([rank(0, 0), rank(1, 7)], procs_per_node=1, timed_out=[])
    assert [v.passed for v in verdicts] == [False, False]
    assert "7 wrong elements" in verdicts[1].reasons[0]


def test_judge_blames_a_rank_that_failed_on_its_own() -> None:
    failed = CheckResult(name="all_gather", group=[0, 1], passed=False, error="RuntimeError: boom")
    reports = [
        RankReport(rank=0, node=0, local_rank=0, phase="done", finished=True, checks=[failed]),
        RankReport(rank=1, node=1, local_rank=0, phase="done", finished=True),
    ]
    verdicts = judge(reports, procs_per_node=1, timed_out=[])
    assert [v.passed for v in verdicts] == [False, True] and "boom" in verdicts[0].reasons[0]


def test_judge_picks_the_laggard_when_everyone_hangs() -> None:
    reports = [
        RankReport(rank=0, node=0, local_rank=0, phase="all_reduce", progress=4),
        RankReport(rank=1, node=1, local_rank=0, phase="rendezvous", progress=1),
    ]
    verdicts = judge(reports, procs_per_node=1, timed_out=[0, 1])
    assert [v.passed for v in verdicts] == [True, False]


def test_the_compute_step_is_deterministic_and_corruption_shows() -> None:
    cpu = torch.device("cpu")
    assert torch.equal(compute_step(cpu), compute_step(cpu))
    clean, corrupt = compute_digest(cpu, {}), compute_digest(cpu, {"STALWART_FAULT_CORRUPT_COMPUTE": "1"})
    assert clean != corrupt
    assert disagreeing_ranks({0: clean, 1: clean, 2: corrupt}) == [2]
    assert disagreeing_ranks({0: clean, 1: corrupt}) == [0, 1]  # no majority: both suspect
    assert disagreeing_ranks({0: clean}) == []


def _finest_step_bits(t: torch.Tensor) -> int:
    """The k of the finest power of two 2**-k that every entry is a whole multiple of."""
    nonzero = t.double().abs()[t != 0]
    return next(k for k in range(64) if torch.equal(nonzero * 2.0**k, torch.round(nonzero * 2.0**k)))


def _bits_for_any_order(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mantissa bits that every partial sum of a @ b needs, whatever order a kernel adds in: the sum
    of the terms' magnitudes, counted in the finest step of their products."""
    magnitude = (a.double().abs() @ b.double().abs()).max().item()
    return math.log2(magnitude * 2.0 ** (_finest_step_bits(a) + _finest_step_bits(b)) + 1)


def test_the_compute_step_is_exact_so_no_kernel_order_can_change_its_bits() -> None:
    """A controller's process and a check rank once got different bits for the same step (MKL's sums
    depend on alignment); exact arithmetic makes the reference that breaks a tie trustworthy."""
    cpu = torch.device("cpu")
    model = reference_model(cpu).double()
    w1, b1, w2, b2 = model.parameters()
    x, target = fixed((BATCH, IN), 10, cpu).double(), fixed((BATCH, OUT), 20, cpu).double()
    hidden = torch.relu(x @ w1.T + b1)
    out = hidden @ w2.T + b2
    grad_out = 2 * (out - target)
    grad_hidden = (grad_out @ w2) * (hidden > 0)
    products = [(x, w1.T), (hidden, w2.T), (grad_out.T, hidden), (grad_out, w2), (grad_hidden.T, x)]
    assert max(_bits_for_any_order(a, b) for a, b in products) < 24  # float32's mantissa
    grads = [grad_hidden.T @ x, grad_hidden.sum(0), grad_out.T @ hidden, grad_out.sum(0)]
    stepped = [p.detach() - LR * g for p, g in zip((w1, b1, w2, b2), grads, strict=True)]
    exact = torch.cat([out.detach().flatten(), *(p.flatten() for p in stepped)])
    assert torch.equal(compute_step(cpu).double(), exact)  # float32 got the float64 answer, bit for bit
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # another blocking of the same sums
    try:
        assert torch.equal(compute_step(cpu).double(), exact)
    finally:
        torch.set_num_threads(threads)


def _computed(digests: list[str]) -> list[RankReport]:
    """Finished ranks, one a node, with their compute digests and their majority view of them."""
    views = disagreeing_ranks(dict(enumerate(digests)))
    return [
        RankReport(
            rank=r, node=r, local_rank=0, phase="done", finished=True, compute_digest=d, compute_mismatch_ranks=views
        )
        for r, d in enumerate(digests)
    ]


def test_the_reference_decides_between_the_ranks_answers_and_never_against_all_of_them() -> None:
    """Two nodes that disagree: the reference says which one computes wrong. Ranks that all agree
    are right whatever the reference says; a reference that matches none of them is outvoted."""

    def passed(verdicts: list[NodeVerdict]) -> list[bool]:
        return [v.passed for v in verdicts]

    split = _computed(["good", "bad"])
    assert passed(judge(split, 1, timed_out=[])) == [False, False]  # no majority: both suspect
    verdicts = judge(split, 1, timed_out=[], reference=lambda _: "good")
    assert passed(verdicts) == [True, False] and "differs from the reference" in verdicts[1].reasons[0]
    assert passed(judge(_computed(["same", "same"]), 1, timed_out=[], reference=lambda _: "other")) == [True, True]
    verdicts = judge(_computed(["a", "a", "b"]), 1, timed_out=[], reference=lambda _: "c")
    assert passed(verdicts) == [True, True, False] and "differs from the other ranks'" in verdicts[2].reasons[0]
    assert "the reference gave c" in verdicts[2].reasons[0]  # what it said, when it did not decide
    tie = judge(split, 1, timed_out=[], reference=lambda _: None)
    assert passed(tie) == [False, False] and all("the reference gave nothing" in v.reasons[0] for v in tie)
    assert "reference" not in judge(split, 1, timed_out=[])[0].reasons[0]  # none was asked


def test_topology_helpers() -> None:
    assert node_groups(2, 2) == [[0, 1], [2, 3]]
    assert neighbour_pairs(1) == [] and neighbour_pairs(2) == [(0, 1)]
    assert neighbour_pairs(4) == [(0, 1), (1, 2), (2, 3), (0, 3)]
    assert pattern(3, src=1).tolist() == [4.0, 5.0, 6.0] and pattern(1, src=0, dst=1).tolist() == [8.0]


def test_judge_blames_the_hung_node_not_a_group_that_timed_out_behind_it() -> None:
    """Node 0 hangs; node 1 waits for it in one collective and so never joins node 2's group, which
    times out. Only node 0 is at fault (seen in pre-flight with a standby as the third node)."""
    waiting = CheckResult(name="all_reduce", group=[0, 1], passed=False, error="RuntimeError: timed out")
    behind = CheckResult(name="all_reduce", group=[1, 2], passed=False, error="RuntimeError: timed out")
    reports = [
        RankReport(rank=0, node=0, local_rank=0, phase="joined", progress=1),
        RankReport(rank=1, node=1, local_rank=0, phase="done", finished=True, checks=[waiting]),
        RankReport(rank=2, node=2, local_rank=0, phase="done", finished=True, checks=[behind]),
    ]
    verdicts = {v.node: v for v in judge(reports, 1, timed_out=[0])}
    assert not verdicts[0].passed and verdicts[1].passed and verdicts[2].passed
    assert "after ranks 0 hung" in verdicts[2].reasons[0]


def test_a_timed_collective_times_the_collective_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """No input is built inside a timed op: on an H100, building a fresh pattern for every timed
    all-reduce made it 600 times slower than an all-gather of the same size (docs/gpu.md)."""
    import torch.distributed as dist

    from stalwart.health import collectives

    built: list[int] = []
    inside: list[int] = []
    real_pattern, real_timed = collectives.pattern, collectives._timed

    def counting_pattern(*args, **kwargs):  # type: ignore[no-untyped-def]
        built.append(1)
        return real_pattern(*args, **kwargs)

    def timed(op, device, iters=collectives.ITERS):  # type: ignore[no-untyped-def]
        before = len(built)
        seconds = real_timed(op, device, iters)
        inside.append(len(built) - before)
        return seconds

    monkeypatch.setattr(collectives, "pattern", counting_pattern)
    monkeypatch.setattr(collectives, "_timed", timed)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        checks = (collectives.all_reduce_check, collectives.all_gather_check, collectives.all_to_all_check)
        results = [check(dist.group.WORLD, [0], 0, 4096, torch.device("cpu")) for check in checks]
    finally:
        dist.destroy_process_group()
    assert all(r.passed and r.mismatches == 0 for r in results)
    assert len(inside) == 6 and sum(inside) == 0  # a latency and a sized op per check
