"""Bus bandwidth is judged: against the spec's floor, or on GPUs against half the peers' median."""

from __future__ import annotations

from stalwart.health.bandwidth import slow_links
from stalwart.health.collective_records import CheckResult, RankReport
from stalwart.health.collective_runner import assemble


def rank(r: int, per: int, backend: str, **bandwidth: float) -> RankReport:
    checks = [CheckResult(name=k, group=[r], passed=True, bus_bandwidth_gbps=v) for k, v in bandwidth.items()]
    return RankReport(
        rank=r,
        node=r // per,
        local_rank=r % per,
        backend=backend,
        phase="done",
        progress=8,
        finished=True,
        checks=checks,
        compute_digest="same",
    )


def four_nodes(backend: str, slow_node_gbps: float) -> list[RankReport]:
    """Four nodes of two ranks; node 2's intra-node all-to-all is slow on both its ranks."""
    return [rank(r, 2, backend, all_to_all=slow_node_gbps if r // 2 == 2 else 300.0, all_reduce=40.0) for r in range(8)]


def test_on_gpus_a_node_far_below_its_peers_median_fails() -> None:
    reports = four_nodes("nccl", slow_node_gbps=60.0)
    assert list(slow_links(reports)) == [2]
    [why] = slow_links(reports)[2]
    assert why.startswith("all_to_all over [4]: bus bandwidth 60.00 GB/s, below half its peers' median (300.00 GB/s)")
    verdicts = assemble(reports, 2, [], {}, backend="nccl", started_at=0).nodes
    assert [v.passed for v in verdicts] == [True, True, False, True]
    assert not assemble(reports, 2, [], {}, backend="nccl", started_at=0).passed


def test_a_node_somewhat_slower_than_its_peers_passes() -> None:
    assert slow_links(four_nodes("nccl", slow_node_gbps=200.0)) == {}


def test_one_slow_op_among_a_nodes_ranks_is_noise() -> None:
    reports = four_nodes("nccl", slow_node_gbps=300.0)
    reports[4] = rank(4, 2, "nccl", all_to_all=10.0, all_reduce=40.0)  # rank 5 on the same node is fine
    assert slow_links(reports) == {}


def test_on_cpu_only_the_specs_floor_is_judged() -> None:
    # Loopback bandwidth measures the CPU scheduler: no peer judgement without GPUs.
    reports = four_nodes("gloo", slow_node_gbps=0.5)
    assert slow_links(reports) == {}
    floors = dict.fromkeys(range(4), 1.0)
    assert list(slow_links(reports, floors)) == [2]
    assert "below the spec's floor 1.00 GB/s" in slow_links(reports, floors)[2][0]
    assert assemble(reports, 2, [], {}, backend="gloo", started_at=0, bandwidth_floors=floors).nodes[2].passed is False
