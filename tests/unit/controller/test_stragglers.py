"""Stragglers: per-rank scores (pure) and the detector that evicts a rank slow at its own work."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from support.controller_harness import Harness, worker

from stalwart.controller.core.detectors.straggler_scores import (
    Sample,
    own_work,
    peer_groups,
    score_group,
    slow_ranks,
)
from stalwart.store.records import JobStage, PhaseTimes

STEP = 0.125  # the example's step: compute 60 ms (DDP's all-reduce inside), a 50 ms pause, data, optimizer
BASE = {"data": 0.002, "compute": 0.06, "optimizer": 0.008, "comm": 0.003, "other": 0.052}


def _samples(own: dict[str, float], n: int, first: int = 1) -> list[Sample]:
    return [Sample(first + i, own) for i in range(n)]


# -- scores --------------------------------------------------------------------------------------
def test_own_work_leaves_out_the_phases_that_wait_for_peers() -> None:
    phases = PhaseTimes(data=0.01, compute=0.5, optimizer=0.02, comm=0.3, other=0.04)
    assert own_work(phases, 0.87) == {"data": 0.01, "optimizer": 0.02, "other": 0.04}
    assert own_work(None, 0.2) == {"step": 0.2}  # a script that times no phase: its step time
    assert own_work(None, None) is None


def test_a_rank_slow_at_its_own_work_scores_low_and_names_its_phase() -> None:
    healthy = {"data": 0.002, "optimizer": 0.008, "other": 0.052}
    slow_data = {**healthy, "data": 0.002 + 0.0625}  # a 1.5x step, lost loading data
    history = {0: _samples(healthy, 10), 1: _samples(healthy, 10), 2: _samples(slow_data, 10), 3: _samples(healthy, 10)}
    scores = score_group(history, 8, min_samples=5)
    assert scores[2].phase == "data" and scores[2].relative < 0.5
    assert all(scores[r].relative == 1.0 for r in (0, 1, 3))
    [(rank, verdict)] = slow_ranks(scores, 0.8, STEP, 0.05).items()
    assert rank == 2 and verdict.cause == "slow data loading" and verdict.cost == pytest.approx(0.5)


def test_ranks_slowed_together_keep_their_scores() -> None:
    """A data-mixture change (or a shared filesystem) slows every rank's loading alike: no straggler."""
    slower = {"data": 0.05, "optimizer": 0.008, "other": 0.052}
    history = {
        r: _samples({"data": 0.002, "optimizer": 0.008, "other": 0.052}, 10) + _samples(slower, 10) for r in range(4)
    }
    scores = score_group(history, 8, min_samples=5)
    assert slow_ranks(scores, 0.8, STEP, 0.05) == {}
    assert all(s.relative == 1.0 and s.individual < 0.6 for s in scores.values())  # each slower than it was


def test_a_tiny_phase_that_doubles_costs_nothing() -> None:
    tiny = {"data": 0.001, "optimizer": 0.001, "other": 0.001}
    doubled = {"data": 0.002, "optimizer": 0.002, "other": 0.002}
    history = {0: _samples(tiny, 10), 1: _samples(tiny, 10), 2: _samples(doubled, 10)}
    scores = score_group(history, 8, min_samples=5)
    assert scores[2].relative == pytest.approx(0.5)
    assert slow_ranks(scores, 0.8, STEP, 0.05) == {}  # 3 ms on a 125 ms step


def test_too_few_samples_are_neither_scored_nor_compared_with() -> None:
    own = {"step": 0.1}
    scores = score_group({0: _samples(own, 10), 1: _samples(own, 3)}, 8, min_samples=5)
    assert scores == {}


def test_peer_groups_follow_the_megatron_layout() -> None:
    assert peer_groups(4) == [[0, 1, 2, 3]]
    # TP 2, PP 2, DP 2: rank = tp + 2 * (dp + 2 * pp)
    assert peer_groups(8, tensor=2, pipeline=2) == [[0, 2], [1, 3], [4, 6], [5, 7]]


# -- the detector --------------------------------------------------------------------------------
Phases = Callable[[int, int], dict[str, Any]]


def _steps(
    h: Harness,
    steps: range,
    phases: Phases,
    per_beat: int = 4,
    *,
    nodes: tuple[str, str] = ("node-0", "node-1"),
    generation: int = 1,
    first_step: int = 1,
) -> None:
    """Heartbeats once a second, each carrying every rank's latest step (per_beat steps apart, from
    `first_step`; the phases' `cpu_wait` is part of the step's wall time)."""
    for k in steps:
        h.clock.advance(1.0)
        step = first_step - 1 + k * per_beat
        for i, node in enumerate(nodes):
            ranks = []
            for r in (2 * i, 2 * i + 1):
                p = phases(r, step)
                wall = sum(float(v) for key, v in p.items() if key not in ("saving", "cpu_wait"))
                ranks.append(
                    worker(
                        r,
                        step=step,
                        first_step=first_step,
                        step_time=wall,
                        phases=PhaseTimes(**p),  # type: ignore[arg-type]
                        last_progress_at=h.clock.now,
                    )
                )
            h.beat(node, generation, ranks)
        h.tick()


def _harness(**ft: object) -> Harness:
    h = Harness(faultTolerance={"stragglerWindowSeconds": 20, "stragglerWarmupSteps": 20, **ft}, standbys={"count": 1})
    h.running(standbys=["node-2"], next_node_index=3)
    h.join("node-2")
    return h


def _slow(rank: int, phase: str, seconds: float, from_step: int = 0, until: int = 10**9) -> Phases:
    def phases(r: int, step: int) -> dict[str, float | bool]:
        p: dict[str, float | bool] = dict(BASE)
        if r == rank and from_step <= step < until:  # its peers wait for it in compute (DDP's all-reduce)
            p[phase] = float(p[phase]) + seconds
        elif from_step <= step < until and phase == "other":
            p["compute"] = float(p["compute"]) + seconds
        return p

    return phases


@pytest.mark.parametrize(
    ("phase", "seconds", "cause"),
    [
        ("other", 0.025, "slow compute or a throttled host"),  # 1.2x of the step
        ("data", 0.0625, "slow data loading"),  # 1.5x
        ("optimizer", 0.0625, "slow optimizer step"),
    ],
)
def test_a_straggler_is_evicted_with_its_phase_named(phase: str, seconds: float, cause: str) -> None:
    h = _harness()
    _steps(h, range(1, 45), _slow(3, phase, seconds, from_step=40))
    [incident] = h.incidents()
    assert incident.failure_class.value == "Slowdown" and incident.suspects == ["node-1"] and incident.rank == 3
    assert incident.evidence[0].startswith(f"rank 3 on node-1 is a straggler: {cause}"), incident.evidence
    assert incident.verdict is not None and incident.verdict["failure_class"] == "straggler"
    assert incident.evicted == ["node-1"]


def test_the_straggler_must_stay_slow_for_the_window() -> None:
    h = _harness(stragglerWindowSeconds=60)
    _steps(h, range(1, 40), _slow(3, "data", 0.0625, from_step=40))
    assert h.incidents() == []
    _steps(h, range(40, 80), _slow(3, "data", 0.0625, from_step=40))
    [incident] = h.incidents()
    assert incident.suspects == ["node-1"]


def test_a_straggler_that_recovers_by_itself_is_not_evicted() -> None:
    h = _harness()
    slow = _slow(2, "data", 0.1, from_step=40, until=80)  # ten heartbeats slow, then itself again
    _steps(h, range(1, 60), slow)
    assert h.incidents() == [] and h.state().stage is JobStage.RUNNING


def test_checkpoint_saves_and_the_warmup_are_not_scored() -> None:
    """Rank 0 stages every save (a long `other`), every other sampled step; the first steps of a
    generation are slow on rank 1 (its compile, its cache): nobody is evicted."""

    def phases(r: int, step: int) -> dict[str, float | bool]:
        p: dict[str, float | bool] = dict(BASE)
        if r == 0 and step % 8 == 0:
            p["other"], p["saving"] = 0.3, True
        if r == 1 and step < 20:
            p["data"] = 1.0
        return p

    h = _harness()
    _steps(h, range(1, 60), phases)
    assert h.incidents() == []


def test_noise_on_every_rank_evicts_nobody() -> None:
    """A busy host: each rank's own work jitters by up to 60% from step to step, independently."""

    def phases(r: int, step: int) -> dict[str, float | bool]:
        jitter = ((step * 7919 + r * 104729) % 61) / 100  # 0..0.6, a different sequence per rank
        return {**BASE, "other": 0.052 * (1 + jitter), "optimizer": 0.008 * (1 + jitter)}

    h = _harness()
    _steps(h, range(1, 80), phases)
    assert h.incidents() == []


def test_a_rank_whose_score_dips_now_and_then_is_not_evicted() -> None:
    """A loaded host: rank 2 is a little slower than its peers all along (a score near 0.82, under
    the threshold plus its hysteresis), and for 8 heartbeats in every 24 it dips far below: slow in
    a third of the evaluations, never for the window. Nobody is evicted."""

    def phases(r: int, step: int) -> dict[str, float | bool]:
        p: dict[str, float | bool] = dict(BASE)
        if r == 2:
            dip = (step // 4) % 24 < 8
            p["other"] = float(p["other"]) + (0.04 if dip else 0.0136)
        return p

    h = _harness()
    _steps(h, range(1, 150), phases)
    assert h.incidents() == [] and h.state().stage is JobStage.RUNNING


def test_a_data_mixture_change_evicts_nobody() -> None:
    """At step 160 the mixture turns to a source that is slower to read: every rank's data loading
    goes from 2 ms to 50 ms a step, for good. Each rank is slower than it was, none than its peers."""

    def phases(r: int, step: int) -> dict[str, float | bool]:
        p: dict[str, float | bool] = dict(BASE)
        if step >= 160:
            p["data"] = 0.05 + 0.002 * r
        return p

    h = _harness()
    _steps(h, range(1, 90), phases)
    assert h.incidents() == [] and h.state().stage is JobStage.RUNNING


# -- after a hot swap ----------------------------------------------------------------------------
# The example job on a loaded 2-core machine, as traced after a hot swap (load 25-40): each step's
# compute holds DDP's all-reduce, `other` a 30 ms pause; node-1 was swapped for the standby node-2,
# whose ranks (2 and 3) resumed with node-0's from the checkpoint of step 160.
LOADED = {"data": 0.0006, "compute": 0.15, "optimizer": 0.0014, "comm": 0.03, "other": 0.032}
SWAPPED = {"nodes": ("node-0", "node-2"), "generation": 2, "first_step": 161}


def _swapped(**ft: object) -> Harness:
    h = Harness(faultTolerance={"stragglerWindowSeconds": 20, "stragglerWarmupSteps": 20, **ft}, standbys={"count": 1})
    h.running(generation=2, slots=("node-0", "node-2"), standbys=["node-3"], next_node_index=4)
    h.join("node-3")
    return h


def _waits_for_a_cpu(rank: int, step: int) -> bool:
    """Rank 0 gets a core last after the all-reduce on two steps in three, its peers on one in four."""
    draw = random.Random(step * 8 + rank).random()  # the same draws every run
    return draw < 2 / 3 if rank == 0 else draw < 1 / 4


def _after_the_swap(measured: bool, straggler: int | None = None) -> Phases:
    def phases(r: int, step: int) -> dict[str, Any]:
        p: dict[str, Any] = dict(LOADED)
        if step < 181 and r in (2, 3):
            p["data"] = 0.3  # the standby's warm-up: its loader's first batches
        if step == 172:  # the generation's first save: its ranks agree on a plan, the optimizer waits for the copy
            p["optimizer"], p["saving"] = 0.1, True
        elif step % 10 == 2:
            p["other"], p["saving"] = 0.06, True  # a save's staging
        if _waits_for_a_cpu(r, step):
            waits = {"data": 0.01, "optimizer": 0.022, "other": 0.015}
            for phase, seconds in waits.items():
                p[phase] += seconds
            if measured:
                p["cpu_wait"] = waits
        if r == straggler and step >= 200:
            p["data"] += 0.11  # a slow loader (1.5x the step): its own work, no CPU wait in it
        return p

    return phases


def test_after_a_hot_swap_a_rank_that_waits_for_a_cpu_is_not_evicted() -> None:
    """The false eviction of a healthy rank after a swap: the new generation's warm-up, its first
    save (the optimizer waits at the step guard) and a rank that, for minutes, gets a core last after
    each all-reduce. Its optimizer step takes 17x its peers' on two steps in three: waiting, not
    working. Reported as CPU wait, it is left out of its own work: nobody is evicted."""
    h = _swapped()
    _steps(h, range(1, 150), _after_the_swap(measured=True), per_beat=3, **SWAPPED)  # type: ignore[arg-type]
    assert h.incidents() == [] and h.state().stage is JobStage.RUNNING


def test_where_the_cpu_wait_is_not_measured_the_waiting_rank_scores_as_a_straggler() -> None:
    """The same steps from a script that times its phases without StepTimer (report_step's own times,
    no CPU wait): the waits count as rank 0's own work, and its node is evicted as a slow optimizer."""
    h = _swapped()
    _steps(h, range(1, 150), _after_the_swap(measured=False), per_beat=3, **SWAPPED)  # type: ignore[arg-type]
    [incident] = h.incidents()
    assert incident.rank == 0 and incident.suspects == ["node-0"]
    assert incident.verdict is not None and incident.verdict["straggler"]["phase"] == "optimizer"


def test_after_a_hot_swap_a_real_straggler_among_cpu_waits_is_evicted() -> None:
    h = _swapped()
    _steps(h, range(1, 150), _after_the_swap(measured=True, straggler=3), per_beat=3, **SWAPPED)  # type: ignore[arg-type]
    [incident] = h.incidents()
    assert incident.rank == 3 and incident.suspects == ["node-2"], incident.evidence
    assert incident.evidence[0].startswith("rank 3 on node-2 is a straggler: slow data loading")


def test_the_standbys_ranks_warm_up_unscored_after_a_swap() -> None:
    """The standby's ranks load their first 20 batches slowly (a cold loader, a cold page cache): a
    window's worth of heartbeats, one step each, and no eviction: every rank's first steps of the
    generation are its warm-up, whatever node it runs on."""

    def phases(r: int, step: int) -> dict[str, Any]:
        return {**LOADED, "data": 0.3 if r in (2, 3) and step < 181 else LOADED["data"]}

    h = _swapped(stragglerWindowSeconds=10)
    _steps(h, range(1, 21), phases, per_beat=1, **SWAPPED)  # type: ignore[arg-type]
    _steps(h, range(7, 40), phases, per_beat=3, **SWAPPED)  # type: ignore[arg-type]
    assert h.incidents() == [] and h.state().stage is JobStage.RUNNING


def test_own_work_leaves_out_the_cpu_wait() -> None:
    phases = PhaseTimes(
        data=0.02, compute=0.5, optimizer=0.03, comm=0.3, other=0.04, cpu_wait={"optimizer": 0.025, "other": 0.05}
    )
    assert own_work(phases, 0.89) == pytest.approx({"data": 0.02, "optimizer": 0.005, "other": 0.0})
