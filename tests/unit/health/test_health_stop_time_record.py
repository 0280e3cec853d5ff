"""A hang with no suspect runs the stop-time checks, and its incident records that they ran, on which
nodes, and what the failure counts for: one more unexplained failure towards a dual-phase replay
(the controller's core, its fake clock and runner; the e2e test does it with `stalwart run`)."""

from __future__ import annotations

from support.controller_harness import Harness, worker

from stalwart.cluster.base import PreflightVerdict
from stalwart.controller.core.work import Diagnosis as Finding
from stalwart.controller.core.work import NodeChecks
from stalwart.store.records import JobStage as S

NODES = ("node-0", "node-1")


def hang_with_no_suspect(h: Harness) -> None:
    """Two captures that blame no one, then the hang is handled: the job goes to its checks."""
    h.clock.advance(6)
    h.tick()
    for _ in range(2):
        capture = h.runner.launched[-1]
        h.runner.finish(capture.key, diagnosis=Finding(suspects=[], evidence=["every rank waits in the same place"]))
        h.tick()
        h.clock.advance(5.5)
        h.tick()
    assert h.state().stage is S.CHECKING, h.state().stage


def run_the_checks(h: Harness, verdicts: list[PreflightVerdict]) -> None:
    generation = h.state().generation
    for i, node in enumerate(NODES):  # the agents stopped the workers: the machines are the checks'
        h.beat(node, generation, [worker(2 * i, exit_code=-15), worker(2 * i + 1, exit_code=-15)])
    h.tick()
    [checks] = [w for w in h.runner.launched if isinstance(w, NodeChecks) and w.purpose == "stop-time"]
    assert checks.nodes == NODES
    h.runner.finish(checks.key, verdicts=verdicts)
    h.tick()


def test_a_suspect_less_hang_records_its_passed_checks_and_counts_towards_a_replay() -> None:
    h = Harness(
        faultTolerance={"hangTimeoutFloorSeconds": 5, "hangTimeoutMultiplier": 10}, failurePolicy={"replayAfter": 2}
    )
    h.running()
    hang_with_no_suspect(h)
    run_the_checks(h, [PreflightVerdict(node=n, passed=True) for n in NODES])
    [incident] = h.incidents()
    assert incident.failure_class.value == "Hang" and incident.suspects == [] and incident.evicted == []
    assert "run stop-time checks" in incident.action, incident.action
    assert (
        "stop-time checks passed on node-0, node-1: unexplained failure 1 of the 2 that start a dual-phase replay"
        in incident.evidence
    ), incident.evidence
    assert h.state().unexplained_failures == 1 and h.state().replay is None


def test_checks_that_find_the_machine_record_it_and_count_nothing() -> None:
    h = Harness(
        faultTolerance={"hangTimeoutFloorSeconds": 5, "hangTimeoutMultiplier": 10},
        failurePolicy={"replayAfter": 2},
        standbys={"count": 1},
    )
    h.running()
    hang_with_no_suspect(h)
    bad = PreflightVerdict(node="node-1", passed=False, reasons=["machine fault: gpu: 7 GPUs visible, 8 expected"])
    run_the_checks(h, [PreflightVerdict(node="node-0", passed=True), bad])
    [incident] = h.incidents()
    assert "stop-time check failed on node-1: machine fault: gpu: 7 GPUs visible, 8 expected" in incident.evidence
    assert not any("passed" in e for e in incident.evidence), incident.evidence
    assert incident.evicted == ["node-1"] and h.state().unexplained_failures == 0
