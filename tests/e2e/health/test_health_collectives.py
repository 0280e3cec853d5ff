"""Collective and compute checks as real processes on loopback (gloo here, NCCL on GPUs)."""

from __future__ import annotations

from pathlib import Path

from support.ranks import forked_check_rank

from stalwart.health.collective_records import CollectiveCheckReport
from stalwart.health.collective_runner import run_collective_check
from stalwart.health.collectives import node_groups

# Generous limits: they bound a broken run, they are not what a passing run takes. The hang test
# uses a short collective timeout so the hung rank's peer gives up quickly. The ranks are forked
# from this worker's rank host, as an agent forks them, except the hang test's: the cold start (the
# default, what an agent without a fork server does) keeps a test.
TIMEOUT = 120.0
COLLECTIVE_TIMEOUT = 15.0
HANG_COLLECTIVE_TIMEOUT = 2.0


def test_healthy_nodes_pass(tmp_path: Path) -> None:
    report = run_collective_check(
        tmp_path,
        nodes=2,
        procs_per_node=2,
        timeout=TIMEOUT,
        start=forked_check_rank,
        collective_timeout=COLLECTIVE_TIMEOUT,
        numel=4096,
    )
    assert report.passed, report.model_dump_json(indent=1)
    assert [n.passed for n in report.nodes] == [True, True] and report.timed_out_ranks == []
    assert report.backend in ("gloo", "nccl")
    for r in report.ranks:
        names = [c.name for c in r.checks]
        assert names == ["all_to_all", "all_reduce", "all_gather"], names
        intra = r.checks[0]
        assert intra.group == node_groups(2, 2)[r.node] and intra.mismatches == 0
        assert r.checks[1].group == [0, 1, 2, 3]  # the two neighbouring nodes
        assert all(c.passed and c.bus_bandwidth_gbps and c.bus_bandwidth_gbps > 0 and c.latency_s for c in r.checks)
        assert r.compute_mismatch_ranks == []
    assert len({r.compute_digest for r in report.ranks}) == 1
    assert CollectiveCheckReport.loads(report.dumps()).passed


def test_a_node_with_corrupt_compute_is_flagged(tmp_path: Path) -> None:
    # Three single-process nodes: the smallest world with a majority, and a ring of three pairs.
    report = run_collective_check(
        tmp_path,
        nodes=3,
        procs_per_node=1,
        timeout=TIMEOUT,
        start=forked_check_rank,
        collective_timeout=COLLECTIVE_TIMEOUT,
        numel=1024,
        rank_env={2: {"STALWART_FAULT_CORRUPT_COMPUTE": "1"}},
    )
    assert not report.passed
    assert report.failed_nodes == [2]
    [bad] = [n for n in report.nodes if n.node == 2]
    assert "rank 2" in bad.reasons[0] and "compute" in bad.reasons[0]
    assert all(r.compute_mismatch_ranks == [2] for r in report.ranks)
    assert all(c.passed for r in report.ranks for c in r.checks)  # the network was fine
    assert sorted(tuple(c.group) for c in report.ranks[0].checks) == [(0, 1), (0, 1), (0, 2), (0, 2)]


def test_a_node_whose_collective_hangs_is_flagged_not_its_peer(tmp_path: Path) -> None:
    report = run_collective_check(
        tmp_path,
        nodes=2,
        procs_per_node=1,
        timeout=TIMEOUT,
        collective_timeout=HANG_COLLECTIVE_TIMEOUT,
        numel=1024,
        rank_env={1: {"STALWART_FAULT_COLLECTIVE_HANG": "1"}},
    )
    assert not report.passed
    assert report.timed_out_ranks == [1] and report.failed_nodes == [1]
    hung = next(r for r in report.ranks if r.rank == 1)
    assert not hung.finished and hung.phase == "joined"
    peer = next(r for r in report.ranks if r.rank == 0)
    assert peer.finished and not all(c.passed for c in peer.checks)  # it timed out waiting, and said so
    assert any("waiting for rank 1" in reason for reason in report.nodes[0].reasons)


def test_a_slow_starting_rank_is_not_mistaken_for_a_hung_one(tmp_path: Path) -> None:
    # Rank 1 starts 4 s late, twice the collective timeout: rendezvous waits for it.
    report = run_collective_check(
        tmp_path,
        nodes=2,
        procs_per_node=1,
        timeout=TIMEOUT,
        start=forked_check_rank,
        collective_timeout=HANG_COLLECTIVE_TIMEOUT,
        numel=1024,
        rank_env={1: {"STALWART_FAULT_SLOW_START_SECONDS": "4"}},
    )
    assert report.passed, report.model_dump_json(indent=1)


def test_a_node_with_four_workers_checks_all_four(tmp_path: Path) -> None:
    """One rank per worker (controller.core.work.check_procs): every GPU of the node takes part."""
    report = run_collective_check(
        tmp_path,
        nodes=1,
        procs_per_node=4,
        timeout=TIMEOUT,
        start=forked_check_rank,
        collective_timeout=COLLECTIVE_TIMEOUT,
        numel=1024,
        bandwidth_floor_gbps=1e-9,  # the spec's floor, judged: any working loopback clears it
    )
    assert report.passed, report.model_dump_json(indent=1)
    assert sorted(r.local_rank for r in report.ranks) == [0, 1, 2, 3]
    for r in report.ranks:
        [intra] = [c for c in r.checks if c.name == "all_to_all"]
        assert intra.group == [0, 1, 2, 3] and intra.passed and intra.bus_bandwidth_gbps
