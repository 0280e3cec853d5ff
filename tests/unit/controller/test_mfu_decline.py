"""Throughput and MFU (pure), and the MFU-decline incident: restart after the stop-time checks."""

from __future__ import annotations

import pytest
from support.controller_harness import Harness, spec_document, worker

from stalwart.controller.core.detectors.throughput import job_throughput
from stalwart.controller.core.policy import Classified, Counters, decide
from stalwart.spec import parse_job
from stalwart.spec.model import FailureAction, FailureEvent

ROLE = {"name": "trainer", "replicas": 2, "processesPerNode": 2, "command": ["python", "train.py"]}


def test_throughput_sums_the_ranks_and_mfu_needs_every_rank_s_peak() -> None:
    spec = parse_job(spec_document(roles=[{**ROLE, "peakFlopsPerWorker": 1e12}]), "t").spec
    ranks = [worker(r, step=9, step_time=0.5, tokens_per_second=1000.0, flops_per_second=2.5e11) for r in range(4)]
    t = job_throughput(ranks, spec)
    assert t.tokens_per_second == 4000 and t.steps_per_second == 2.0 and t.pace == 4000
    assert t.flops_per_second == 1e12 and t.mfu == pytest.approx(0.25)
    plain = parse_job(spec_document(), "t").spec
    assert job_throughput(ranks, plain).mfu is None  # no peak: no MFU
    assert job_throughput([worker(0, step=9, step_time=0.25)], plain).pace == 4.0  # steps/s with no tokens


def test_an_mfu_decline_restarts_after_the_stop_time_checks() -> None:
    policy = parse_job(spec_document(), "t").spec.failure_policy
    decision = decide(Classified(FailureEvent.MFU_DECLINE, [], ["down 20%"]), policy, Counters(0, 0))
    assert decision.action is FailureAction.RESTART and decision.stop_time_checks and not decision.counted


def _run(h: Harness, seconds: int, tokens: float, first: int = 0) -> None:
    for k in range(seconds):
        h.clock.advance(1.0)
        step = 30 + first + k
        h.run_generation(
            1,
            ["node-0", "node-1"],
            step=step,
            first_step=1,
            step_time=0.1,
            tokens_per_second=tokens,
            last_progress_at=h.clock.now,
        )
        h.tick()


def test_a_sustained_decline_is_an_incident_and_a_short_one_is_not() -> None:
    h = Harness(faultTolerance={"throughputDeclineWindowSeconds": 20})
    h.running()
    _run(h, 40, 1000.0)
    _run(h, 15, 700.0, first=40)  # a dip shorter than the window
    _run(h, 25, 1000.0, first=55)
    assert h.incidents() == []
    _run(h, 25, 850.0, first=80)  # 15% down, for longer than the window
    [incident] = h.incidents()
    assert incident.failure_class is FailureEvent.MFU_DECLINE and incident.suspects == []
    assert incident.evidence[0].startswith("the job's throughput fell to 3,400 tokens/s"), incident.evidence


def test_a_small_decline_is_no_incident() -> None:
    h = Harness(faultTolerance={"throughputDeclineWindowSeconds": 20})
    h.running()
    _run(h, 40, 1000.0)
    _run(h, 40, 950.0, first=40)  # 5%: under the default 10%
    assert h.incidents() == []
