"""Slow faults given as a factor of the rank's own step time (`factor=`), not in seconds."""

from __future__ import annotations

import json

import pytest

from stalwart import worker_contract as contract
from stalwart.faults import node_fault_env, parse_fault
from stalwart.faults.worker_faults import SLOW_SIGNAL, WorkerFaults, _Armed


def test_a_factor_reaches_the_workers_and_is_described() -> None:
    fault = parse_fault("slow-worker:rank=3,step=30,factor=1.2")
    assert fault.describe() == "slow-worker rank=3 x1.2 at step 30"
    armed = json.loads(
        node_fault_env([fault, parse_fault("slow-data:rank=2,step=30,factor=1.5")])["*"][contract.FAULT_HOOKS]
    )
    assert armed["slow_step_factor"] == 1.2 and armed["slow_data_factor"] == 1.5


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("slow-worker:rank=3,factor=1.2,seconds=0.1", "not both"),
        ("kill-worker:rank=3,factor=2", "slow-worker, slow-data and slow-optimizer only"),
        ("slow-data:rank=3,factor=1", "factor: Input should be greater than 1"),
    ],
)
def test_a_bad_factor_is_refused_naming_the_problem(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_fault(text)


def test_the_delay_is_the_factor_of_the_rank_s_step_time_before_the_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    slept: list[float] = []
    monkeypatch.setattr("stalwart.faults.worker_faults.time.monotonic", lambda: clock[0])
    monkeypatch.setattr("stalwart.faults.worker_faults.time.sleep", slept.append)
    armed = _Armed(WorkerFaults(signals=True, slow_step_factor=1.5))
    for step in range(10):  # 0.2 s a step
        armed.at_step(step)
        clock[0] += 0.2
    armed.arm(SLOW_SIGNAL, None)
    for step in range(10, 15):
        armed.at_step(step)
        clock[0] += 0.2 + (slept[-1] if slept else 0.0)
    assert slept == pytest.approx([0.1] * 5)  # (1.5 - 1) x 0.2 s, fixed: the slowed steps do not feed it


def test_a_slow_optimizer_slows_the_optimizer_phase_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from stalwart.faults.worker_faults import SLOW_OPTIMIZER_SIGNAL

    slept: list[float] = []
    monkeypatch.setattr("stalwart.faults.worker_faults.time.sleep", slept.append)
    armed = _Armed(WorkerFaults(signals=True, slow_optimizer_seconds=0.2))
    armed.arm(SLOW_OPTIMIZER_SIGNAL, None)
    for phase in ("data", "compute", "optimizer", "comm"):
        armed.at_phase(phase)
    assert slept == [0.2]
    fault = parse_fault("slow-optimizer:rank=1,step=5,factor=1.5")
    armed_env = json.loads(node_fault_env([fault])["*"][contract.FAULT_HOOKS])
    assert armed_env["signals"] and armed_env["slow_optimizer_factor"] == 1.5
