"""HookClock: the integration's own time, wall and the training thread's CPU, per step."""

from __future__ import annotations

import threading

import pytest

from stalwart.agents import worker_sdk
from stalwart.integrations.common import HookClock


def spin(until: threading.Event | None = None, rounds: int = 200_000) -> None:
    total = 0
    for i in range(rounds):
        total += i * i
    if until is not None:
        until.wait()


def test_it_sums_the_time_spent_inside_and_nothing_outside() -> None:
    clock = HookClock()
    cost = clock.per_step()
    assert {k: cost[k] for k in ("wall", "cpu", "steps")} == {"wall": 0.0, "cpu": 0.0, "steps": 0.0}
    with clock:
        spin()
    inside = clock.cpu
    assert inside > 0 and clock.wall > 0
    spin()  # outside: not counted
    assert clock.cpu == inside
    clock.step_done()
    assert clock.per_step()["cpu"] == pytest.approx(inside) and clock.per_step()["steps"] == 1


def test_it_reads_the_cpu_clock_in_one_step_of_eight_and_gives_their_mean() -> None:
    """The thread's CPU clock is a system call: read in steps 1, 9, 17..., every hook of those steps."""
    clock = HookClock()
    for step in range(1, 18):
        for _ in range(2):  # two hooks a step
            with clock:
                spin(rounds=20_000)
        before = clock.cpu
        clock.step_done()
        assert (clock.cpu > 0) and ((before > 0) or step == 1)
    assert clock.steps == 17 and clock.sampled == 3  # steps 1, 9 and 17
    alone = HookClock()
    with alone:
        spin(rounds=40_000)
    # The mean of the sampled steps: a step's CPU, not a third of it (in a range: the clock is real).
    assert 0.3 * alone.cpu < clock.per_step()["cpu"] < 3 * alone.cpu
    assert clock.per_step()["wall"] > 0


def test_its_cpu_time_is_the_calling_thread_s_only() -> None:
    """Another thread's work (a checkpoint writer, another process's load) is not the hook's CPU."""
    clock = HookClock()
    done = threading.Event()
    worker = threading.Thread(target=lambda: (spin(rounds=2_000_000), done.set()))
    with clock:
        worker.start()
        done.wait()  # the hook waits: wall time passes, this thread uses almost no CPU
    worker.join()
    alone = HookClock()
    with alone:
        spin(rounds=2_000_000)
    assert clock.cpu < alone.cpu
    assert clock.wall > clock.cpu


def test_an_exception_inside_is_still_timed() -> None:
    clock = HookClock()
    with pytest.raises(FloatingPointError), clock:
        spin()
        raise FloatingPointError("loss is nan")
    assert clock.cpu > 0


def test_it_counts_the_report_sender_s_cpu_since_it_was_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reports the hooks queue are built and sent on the worker SDK's thread: its CPU, per step."""
    monkeypatch.setattr(worker_sdk, "_sender_cpu", 1.0)  # spent before this clock (another fit, start-up)
    clock = HookClock()
    monkeypatch.setattr(worker_sdk, "_sender_cpu", 1.5)
    for _ in range(4):
        clock.step_done()
    assert clock.per_step()["sender"] == pytest.approx(0.5 / 4)
