"""Node checks through the agents (a cluster's pre-flight and stop-time checks): the request, the
rendezvous and the reports through a real etcd, each agent's CheckDuty answering for its node, and
the verdicts judged as a local run's. The shares' rank processes are stood in for here (what each
rank reports); tests/e2e/operator runs the real ones in the agents' pods."""

from __future__ import annotations

import functools
import threading
import time
import uuid
from pathlib import Path

import pytest

from stalwart.agents import check_duty
from stalwart.agents.check_duty import CheckDuty
from stalwart.cluster.agent_checks import checks_through_agents
from stalwart.health.collective_records import RankReport
from stalwart.health.compute_check import compute_digest
from stalwart.health.distributed_check import CheckRendezvous, CheckRequest, NodeCheckReport, judge_shares
from stalwart.logs import get_logger
from stalwart.store import Store, keys
from stalwart.store.records import NodeRegistration


@functools.cache
def digest_of(corrupt: bool) -> str:
    """A healthy and a corrupt rank's compute digest, computed when a test first asks: the SGD step
    imports torch._dynamo (seconds of CPU), which every xdist worker would pay while collecting."""
    import torch

    return compute_digest(torch.device("cpu"), env={"STALWART_FAULT_CORRUPT_COMPUTE": "1"} if corrupt else {})


def done(rank: int, node: int, digest: str | None = None) -> RankReport:
    return RankReport(
        rank=rank,
        node=node,
        local_rank=0,
        device="cpu",
        phase="done",
        progress=8,
        finished=True,
        compute_digest=digest_of(corrupt=False) if digest is None else digest,
    )


def request(*nodes: str) -> CheckRequest:
    return CheckRequest(
        id="chk-1", nodes=list(nodes), procs_per_node=1, timeout=5, collective_timeout=1, requested_at=time.time()
    )


def test_a_node_without_a_report_is_the_hung_participant() -> None:
    req = request("node-0", "node-1", "node-2")
    reports = {
        "node-0": NodeCheckReport(request_id="chk-1", node="node-0", ranks=[done(0, 0)]),
        "node-2": NodeCheckReport(request_id="chk-1", node="node-2", ranks=[done(2, 2)]),
    }
    report, notes = judge_shares(req, reports)
    passed = {v.node: v.passed for v in report.nodes}
    assert passed == {0: True, 1: False, 2: True} and not report.passed
    assert notes == {"node-1": ["its agent sent no report"]}


def test_the_check_key_layout() -> None:
    assert keys.parse_check_request_key("ml.a", keys.check_request("ml.a", "chk-1")) == "chk-1"
    assert keys.parse_check_request_key("ml.a", keys.check_rendezvous("ml.a", "chk-1")) is None
    assert keys.parse_check_request_key("ml.a", keys.check_report("ml.a", "chk-1", "node-0")) is None


def test_agents_answer_and_the_requester_judges(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three registered nodes and one that is not: node-1 computes wrong, node-2's share cannot run,
    node-3 has no agent. Only node-0 passes; the check's keys are gone afterwards. (A silent agent:
    test_a_node_without_a_report_is_the_hung_participant.)"""
    job = f"ml.checks-{uuid.uuid4().hex[:6]}"
    log = get_logger("test", job=job)
    for node in ("node-0", "node-1", "node-2"):
        store.put(
            keys.node_registration(job, node),
            NodeRegistration(node=node, job=job, host="h", agent_pid=1, registered_at=0, lease_id=0),
        )
    rendezvous: list[CheckRendezvous | None] = []

    def share(req: CheckRequest, node: str, workdir: Path, where, start) -> NodeCheckReport:  # type: ignore[no-untyped-def]
        if node == "node-2":
            raise OSError("no space left on device")
        rendezvous.append(where(time.monotonic() + 30))  # node-0 publishes, node-1 reads it
        index = req.nodes.index(node)
        return NodeCheckReport(
            request_id=req.id, node=node, ranks=[done(index, index, digest_of(corrupt=node == "node-1"))]
        )

    monkeypatch.setattr(check_duty, "run_share", share)
    duties = [CheckDuty(store, job, n, "127.0.0.1", tmp_path / n, log) for n in ("node-0", "node-1", "node-2")]
    for duty in duties:
        duty.watch()
    stop = threading.Event()

    def agents() -> None:  # the agents' loops
        while not stop.wait(0.05):
            for duty in duties:
                duty.serve()

    loop = threading.Thread(target=agents, daemon=True)
    loop.start()
    try:
        verdicts = checks_through_agents(store, job, ["node-0", "node-1", "node-2", "node-3"], 1, log, timeout=30.0)
    finally:
        stop.set()
        loop.join(timeout=5)
    by_node = {v.node: v for v in verdicts}
    assert [v.node for v in verdicts] == ["node-0", "node-1", "node-2", "node-3"]
    assert by_node["node-0"].passed and not by_node["node-1"].passed
    assert any("compute result differs from the reference" in r for r in by_node["node-1"].reasons)
    assert by_node["node-2"].reasons[0] == "OSError: no space left on device" and not by_node["node-2"].passed
    assert by_node["node-3"].reasons == ["its agent is not registered"] and not by_node["node-3"].passed
    assert len(rendezvous) == 2 and rendezvous[0] == rendezvous[1] and rendezvous[0] is not None
    assert store.get_prefix_raw(keys.checks_prefix(job)) == []
