"""The pace's slowdowns on a loaded machine: every rank slowed alike is nobody's fault, checkpoint
saves are no pace samples, a restart's warm-up is no slowdown; a rank that fell behind its peers at
its own work is still evicted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from support.controller_harness import Harness, worker

from stalwart.controller.core.detectors.slowdowns import machine_wide
from stalwart.controller.core.work import Diagnosis as Finding
from stalwart.store.records import JobStage, PhaseTimes

# The example's step (seconds): compute with DDP's all-reduce inside, a pause, data, optimizer.
BASE = {"data": 0.002, "compute": 0.06, "optimizer": 0.008, "comm": 0.003, "other": 0.052}
Phases = Callable[[int, int], dict[str, Any]]


# -- machine_wide (pure) -------------------------------------------------------------------------
def _own(values: list[dict[int, float]], start: float = 0.0) -> list[tuple[float, dict[int, float]]]:
    return [(start + i, v) for i, v in enumerate(values)]


def test_every_rank_slowed_alike_is_the_machine_s_load() -> None:
    samples = _own([dict.fromkeys(range(4), 0.06)] * 8 + [dict.fromkeys(range(4), 0.12)] * 6)
    assert machine_wide(samples, onset=8, suspects={0, 1}, rise=0.12)


def test_a_suspect_that_fell_behind_its_peers_is_no_load() -> None:
    """The whole machine is loaded, and rank 1 lost far more than the others: it is the slowdown."""
    slow = {0: 0.12, 1: 0.30, 2: 0.12, 3: 0.12}
    samples = _own([dict.fromkeys(range(4), 0.06)] * 8 + [slow] * 6)
    assert not machine_wide(samples, onset=8, suspects={0, 1}, rise=0.3)


def test_a_rank_slowed_outside_its_own_work_leaves_the_others_as_they_were() -> None:
    """A throttled GPU slows its rank's compute; the others' own work does not move: the rounds decide."""
    samples = _own([dict.fromkeys(range(4), 0.06)] * 8 + [dict.fromkeys(range(4), 0.061)] * 6)
    assert not machine_wide(samples, onset=8, suspects={2, 3}, rise=0.2)


def test_a_suspect_that_only_waited_longer_for_a_cpu_is_no_culprit() -> None:
    """The machine is loaded and the scheduler serves rank 1 last: its own work with the CPU wait rose
    far more than its peers', without the wait it did not. The load, not rank 1."""
    slow_with_wait = {0: 0.12, 1: 0.30, 2: 0.12, 3: 0.12}
    samples = _own([dict.fromkeys(range(4), 0.06)] * 8 + [slow_with_wait] * 6)
    less_wait = _own([dict.fromkeys(range(4), 0.06)] * 14)
    assert machine_wide(samples, onset=8, suspects={0, 1}, rise=0.3, less_wait=less_wait)
    # Where it also fell behind without the wait, it is the slowdown.
    behind = _own([dict.fromkeys(range(4), 0.06)] * 8 + [{0: 0.06, 1: 0.2, 2: 0.06, 3: 0.06}] * 6)
    assert not machine_wide(samples, onset=8, suspects={0, 1}, rise=0.3, less_wait=behind)


def test_without_phases_or_samples_the_rounds_decide() -> None:
    assert not machine_wide([], onset=0, suspects={0}, rise=0.1)
    few = _own([dict.fromkeys(range(4), 0.06)] * 2 + [dict.fromkeys(range(4), 0.12)] * 6)
    assert not machine_wide(few, onset=2, suspects={0}, rise=0.1)  # too few samples before the onset
    alike = _own([dict.fromkeys(range(4), 0.06)] * 8 + [dict.fromkeys(range(4), 0.12)] * 6)
    assert not machine_wide(alike, onset=8, suspects={7}, rise=0.1)  # no suspect rank among them


# -- the detector --------------------------------------------------------------------------------
def _harness() -> Harness:
    h = Harness(faultTolerance={"slowdownFactor": 2, "slowdownRounds": 2}, standbys={"count": 1})
    h.running(standbys=["node-2"], next_node_index=3)
    h.join("node-2")
    return h


def _steps(h: Harness, steps: range, phases: Phases, generation: int = 1) -> None:
    """One step a tick, every rank reporting it with its phases; the step time is their sum."""
    for step in steps:
        per_rank = {r: phases(r, step) for r in range(4)}
        wall = max(sum(float(v) for k, v in p.items() if k not in ("saving", "cpu_wait")) for p in per_rank.values())
        h.clock.advance(wall)
        for i, node in enumerate(("node-0", "node-1")):
            ranks = [
                worker(
                    r,
                    step=step,
                    first_step=steps.start,
                    step_time=wall,
                    phases=PhaseTimes(**per_rank[r]),  # type: ignore[arg-type]
                    last_progress_at=h.clock.now,
                )
                for r in (2 * i, 2 * i + 1)
            ]
            h.beat(node, generation, ranks)
        h.tick()


def _loaded(from_step: int, factor: float = 3.0) -> Phases:
    """A busy machine from `from_step` on: every rank's every phase takes `factor` times as long."""

    def phases(r: int, step: int) -> dict[str, float | bool]:
        return {k: v * (factor if step >= from_step else 1.0) for k, v in BASE.items()}

    return phases


def _rounds(h: Harness) -> list[tuple[str, ...]]:
    return [w.key for w in h.runner.launched if w.key[:2] == ("stacks", "slowdown")]


def test_a_loaded_machine_evicts_nobody_whatever_the_rounds_lean_to() -> None:
    """Every rank's steps and own work turn 3x slower (other engineers' test suites on the host); the
    rounds catch rank 0 computing and name node-0: no eviction, the pace pauses."""
    h = _harness()
    _steps(h, range(1, 9), _loaded(9))
    _steps(h, range(9, 15), _loaded(9))
    [key] = _rounds(h)
    h.runner.finish(key, diagnosis=Finding(suspects=["node-0"], evidence=["node-0 held the others up"]))
    h.tick()
    assert h.incidents() == [] and h.state().stage is JobStage.RUNNING


def _named_node_0(phases: Phases) -> Harness:
    """14 steps with `phases`, the slowdown's round back naming node-0, one tick to judge it."""
    h = _harness()
    _steps(h, range(1, 15), phases)
    [key] = _rounds(h)
    h.runner.finish(key, diagnosis=Finding(suspects=["node-0"], evidence=["node-0 held the others up"]))
    h.tick()
    return h


def test_a_loaded_machine_whose_ranks_wait_for_a_cpu_evicts_nobody() -> None:
    """The same load, as StepTimer reports it: the own work's rise is time spent waiting for a CPU
    (PhaseTimes.cpu_wait). The straggler scores leave that out; the pace's machine-load check counts
    it, since it is the load it looks for: no eviction."""

    def phases(r: int, step: int) -> dict[str, Any]:
        p: dict[str, Any] = _loaded(9)(r, step)
        if step >= 9:
            p["cpu_wait"] = {k: float(p[k]) - BASE[k] for k in ("data", "optimizer", "other")}
        return p

    h = _named_node_0(phases)
    assert h.incidents() == [] and h.state().stage is JobStage.RUNNING


def test_a_loaded_machine_whose_scheduler_serves_one_node_last_evicts_nobody() -> None:
    """Every rank waits for a CPU, node-0's ranks most (the scheduler serves them last after each
    all-reduce): with the wait, node-0 fell behind; without it, nobody did. No eviction."""

    def phases(r: int, step: int) -> dict[str, Any]:
        p: dict[str, Any] = _loaded(9)(r, step)
        if step >= 9:
            extra = 0.3 if r in (0, 1) else 0.0
            p["optimizer"] = float(p["optimizer"]) + extra
            p["cpu_wait"] = {k: float(p[k]) - BASE[k] for k in ("data", "optimizer", "other")}
        return p

    h = _named_node_0(phases)
    assert h.incidents() == [] and h.state().stage is JobStage.RUNNING


def test_a_rank_slow_at_its_own_work_on_a_loaded_machine_is_still_evicted() -> None:
    """The machine is loaded (every rank 1.5x), and rank 3 sleeps 0.3 s a step on top: node-1."""

    def phases(r: int, step: int) -> dict[str, float | bool]:
        p = _loaded(9, 1.5)(r, step)
        if r == 3 and step >= 9:
            p["other"] = float(p["other"]) + 0.3
        elif step >= 9:
            p["compute"] = float(p["compute"]) + 0.3  # its peers wait for it in DDP's all-reduce
        return p

    h = _harness()
    _steps(h, range(1, 15), phases)
    [key] = _rounds(h)
    h.runner.finish(key, diagnosis=Finding(suspects=["node-1"], evidence=["node-1 held the others up"]))
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "Slowdown" and incident.evicted == ["node-1"]


def test_checkpoint_saves_are_no_pace_samples() -> None:
    """Every other step stages a save on every rank (0.5 s of `other`): the pace never doubles."""

    def phases(r: int, step: int) -> dict[str, float | bool]:
        if step > 8 and step % 2 == 0:
            return {**BASE, "other": 0.5, "saving": True}
        return dict(BASE)

    h = _harness()
    _steps(h, range(1, 30), phases)
    assert _rounds(h) == [] and h.incidents() == []


def test_a_restart_s_warm_up_is_no_slowdown() -> None:
    """A new generation's first steps are slow (its loading, its caches), then the pace settles."""
    h = _harness()

    def warm_up(r: int, step: int) -> dict[str, float | bool]:
        return {**BASE, "compute": 0.5} if step < 106 else dict(BASE)

    _steps(h, range(100, 130), warm_up)
    assert _rounds(h) == [] and h.incidents() == []
