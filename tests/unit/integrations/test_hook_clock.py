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


def sampled() -> HookClock:
    """A clock past its first step (never sampled), in a step whose CPU time it reads."""
    clock = HookClock()
    clock.step_done()
    return clock


def test_it_sums_the_time_spent_inside_and_nothing_outside() -> None:
    clock = HookClock()
    cost = clock.per_step()
    assert {k: cost[k] for k in ("wall", "cpu", "steps")} == {"wall": 0.0, "cpu": 0.0, "steps": 0.0}
    clock.step_done()
    with clock:
        spin()
    inside = clock.cpu
    assert inside > 0 and clock.wall > 0
    spin()  # outside: not counted
    assert clock.cpu == inside
    clock.step_done()
    assert clock.per_step()["cpu"] == pytest.approx(inside) and clock.per_step()["steps"] == 2


def test_it_reads_the_cpu_clock_in_one_step_of_eight_and_gives_their_mean() -> None:
    """The thread's CPU clock is a system call: read in steps 2, 10, 18..., every hook of those steps;
    the first step's one-time work is no step's cost."""
    clock = HookClock()
    cpu_after: list[float] = []
    for _ in range(18):
        for _ in range(2):  # two hooks a step
            with clock:
                spin(rounds=20_000)
        clock.step_done()
        cpu_after.append(clock.cpu)
    assert clock.steps == 18 and clock.sampled == 3  # steps 2, 10 and 18
    grew = [step for step in range(1, 19) if cpu_after[step - 1] > (cpu_after[step - 2] if step > 1 else 0.0)]
    assert grew == [2, 10, 18] and clock.wall > 0
    alone = sampled()
    with alone:
        spin(rounds=40_000)
    # The mean of the sampled steps: a step's CPU, not a third of it (in a range: the clock is real).
    assert 0.3 * alone.cpu < clock.per_step()["cpu"] < 3 * alone.cpu
    assert clock.per_step()["wall"] > 0


def test_its_cpu_time_is_the_calling_thread_s_only() -> None:
    """Another thread's work (a checkpoint writer, another process's load) is not the hook's CPU."""
    clock = sampled()
    done = threading.Event()
    worker = threading.Thread(target=lambda: (spin(rounds=2_000_000), done.set()))
    with clock:
        worker.start()
        done.wait()  # the hook waits: wall time passes, this thread uses almost no CPU
    worker.join()
    alone = sampled()
    with alone:
        spin(rounds=2_000_000)
    assert clock.cpu < alone.cpu
    assert clock.wall > clock.cpu


def test_an_exception_inside_is_still_timed() -> None:
    clock = sampled()
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
