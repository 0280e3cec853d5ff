"""Faults for the health tests. `--inject hang-job:step=N`: every worker is armed through its
environment, and stops at step N in the job's first generation only (a restarted job runs on).
`--inject loss-spike:rank=R,step=S`: the rank's next reported loss, once, is 100x what it computed."""

from __future__ import annotations

import json

import pytest

from stalwart import worker_contract as contract
from stalwart.agents import fault_hooks
from stalwart.faults import worker_faults
from stalwart.faults.injector import _WORKER_SIGNALS
from stalwart.faults.spec import FaultKind, node_fault_env, parse_fault
from stalwart.faults.worker_faults import LOSS_SPIKE_FACTOR, LOSS_SPIKE_SIGNAL, WorkerFaults


def test_the_fault_arms_every_node_through_the_environment() -> None:
    fault = parse_fault("hang-job:step=12")
    assert fault.kind is FaultKind.HANG_JOB and fault.kind.through_environment
    env = node_fault_env([fault])
    armed = WorkerFaults.model_validate(json.loads(env["*"][contract.FAULT_HOOKS]))
    assert armed.hang_at_step == 12 and not armed.signals


@pytest.mark.parametrize(("generation", "hangs"), [("1", True), ("2", False)])
def test_a_worker_stops_at_the_step_in_the_first_generation_only(
    monkeypatch: pytest.MonkeyPatch, generation: str, hangs: bool
) -> None:
    monkeypatch.setenv(contract.GENERATION, generation)
    stopped: list[int] = []
    monkeypatch.setattr(worker_faults, "_injected_job_hang", lambda: stopped.append(1))
    armed = worker_faults._Armed(WorkerFaults(hang_at_step=12))
    for step in (10, 11):
        armed.at_step(step)
    assert stopped == []
    armed.at_step(12)
    assert stopped == ([1] if hangs else [])


def test_a_loss_spike_is_signalled_to_the_named_rank() -> None:
    fault = parse_fault("loss-spike:rank=1,step=8")
    assert fault.kind is FaultKind.LOSS_SPIKE and fault.rank == 1 and not fault.kind.through_environment
    assert _WORKER_SIGNALS[FaultKind.LOSS_SPIKE] == LOSS_SPIKE_SIGNAL
    armed = WorkerFaults.model_validate(json.loads(node_fault_env([fault])["*"][contract.FAULT_HOOKS]))
    assert armed.signals  # every worker answers the signal; the injector sends it to rank 1 alone
    with pytest.raises(ValueError, match="needs rank"):
        parse_fault("loss-spike:step=8")


def test_the_next_reported_loss_after_the_signal_is_a_spike_once() -> None:
    fault_hooks.reset()
    try:
        worker_faults.install(WorkerFaults().model_dump_json())  # the hooks, without the signal handlers
        assert fault_hooks.reported_loss(3, 2.0) == 2.0
        armed = worker_faults._Armed(WorkerFaults())
        fault_hooks.on_loss(armed.reported_loss)
        armed.arm(LOSS_SPIKE_SIGNAL, None)
        assert fault_hooks.reported_loss(4, None) is None  # a rank that reports no loss has no spike
        assert fault_hooks.reported_loss(5, 2.0) == 2.0 * LOSS_SPIKE_FACTOR
        assert fault_hooks.reported_loss(6, 2.0) == 2.0
    finally:
        fault_hooks.reset()
