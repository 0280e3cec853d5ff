"""The on-call commands over records in a real etcd: a job with incidents, nodes, requests and cordons.

The records are written here as the controller and the agents write them, so each view can be
checked field by field (the live run in test_cli_live.py checks them against real processes). For
operator requests, a small responder plays the controller's side of the protocol: it answers each
pending request the way the controller does (status, message, result in the same record).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.ops.requests import WITHDRAWN
from stalwart.spec.model import FailureAction, FailureEvent
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import (
    Assignment,
    CheckpointEntry,
    Cordon,
    Heartbeat,
    Incident,
    JobPhase,
    JobState,
    NodeAssignment,
    NodeRegistration,
    OperatorRequest,
    RequestKind,
    RequestStatus,
    WorkerState,
    WorkerStatus,
)

JOB = "cli-records"
runner = CliRunner()
NOW = time.time()
VERDICT = {
    "job": JOB,
    "generation": 1,
    "failure_class": "hang",
    "blame": "node",
    "confidence": 0.9,
    "action": "evict",
    "summary": "rank 3 is stuck outside the collective the other ranks wait in",
    "suspects": [{"node": "node-b", "score": 0.95, "reasons": ["outlier stack group"], "ranks": [3]}],
    "group": {"kind": "dp", "index": 1, "ranks": [2, 3], "nodes": ["node-b"]},
    "stack_groups": [
        {
            "signature": "a1",
            "frames": ["all_reduce (torch/distributed/distributed_c10d.py:2501)"],
            "ranks": [0, 1, 2],
            "count": 3,
            "outlier": False,
            "state": "collective",
        },
        {
            "signature": "b2",
            "frames": ["_injected_hang (stalwart/agents/worker_sdk.py:60)"],
            "ranks": [3],
            "count": 1,
            "outlier": True,
            "state": "active",
        },
    ],
    "runbook": "hang",
    "evidence": [],
}


def worker(rank: int, **kw: object) -> WorkerStatus:
    fields: dict[str, object] = {
        "local_rank": rank % 2,
        "rank": rank,
        "pid": 1000 + rank,
        "step": 120,
        "state": WorkerState.RUNNING,
        "started_at": NOW - 100,
        "loss": 2.5,
        "step_time": 0.1,
        "last_progress_at": NOW - 1,
    }
    return WorkerStatus(**(fields | kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def store(etcd: EtcdServer) -> Iterator[Store]:
    """A job in generation 2: node-a up, node-b lost after a hang, node-c the standby, two incidents."""
    global NOW
    NOW = time.time()  # the records' times are relative to when they are written, not to the import
    s = Store(etcd.endpoint)
    s.delete_prefix(keys.job_prefix(JOB))
    s.put(
        keys.job_state(JOB),
        JobState(
            job=JOB,
            phase=JobPhase.RUNNING,
            generation=2,
            restarts=1,
            infra_restarts=1,
            slots=["node-a", "node-b"],
            standbys=["node-c"],
            evicted=["node-x"],
            created_at=NOW - 600,
            first_step_at=NOW - 590,
            updated_at=NOW,
        ),
    )
    s.put(
        keys.generation(JOB, 2),
        Assignment(
            job=JOB,
            generation=2,
            world_size=4,
            master_addr="127.0.0.1",
            master_port=1,
            created_at=NOW - 300,
            nodes=[
                NodeAssignment(node="node-a", node_rank=0, role="trainer", first_rank=0, local_world_size=2),
                NodeAssignment(node="node-b", node_rank=1, role="trainer", first_rank=2, local_world_size=2),
            ],
        ),
    )
    for node in ("node-a", "node-c"):
        s.put(
            keys.node_registration(JOB, node),
            NodeRegistration(node=node, job=JOB, host="host-" + node, agent_pid=1, registered_at=NOW, lease_id=1),
        )
    s.put(
        keys.node_heartbeat(JOB, "node-a"),
        Heartbeat(node="node-a", generation=2, sent_at=NOW, workers=[worker(0), worker(1, last_progress_at=NOW - 500)]),
    )
    s.put(
        keys.node_heartbeat(JOB, "node-b"),
        Heartbeat(
            node="node-b",
            generation=2,
            sent_at=NOW - 30,
            workers=[
                worker(2),
                worker(
                    3,
                    state=WorkerState.EXITED,
                    exit_code=-9,
                    exited_at=NOW - 30,
                    failure_class="cpu_oom",
                    log_tail=["step 119 loss 2.51", "Out of memory: Killed process 1003 (python)"],
                ),
            ],
            machine_faults=["disk_full"],
        ),
    )
    s.put(
        keys.incident(JOB, "inc-0001-aaaaaa"),
        Incident(
            id="inc-0001-aaaaaa",
            job=JOB,
            failure_class=FailureEvent.HANG,
            generation=1,
            node="node-x",
            rank=3,
            evidence=["no progress for 61s"],
            action="evict node-x, node-c replaces it",
            policy_action=FailureAction.EVICT,
            suspects=["node-x"],
            evicted=["node-x"],
            replacements={"node-x": "node-b"},
            counted=False,
            verdict=VERDICT,
            failed_at=NOW - 400,
            detected_at=NOW - 339,
            diagnosed_at=NOW - 335,
            restarted_at=NOW - 330,
            first_step_at=NOW - 300,
            step_at_failure=60,
            resumed_step=51,
            loss_before=2.9,
            loss_after=2.95,
            mean_step_time=0.1,
        ),
    )
    s.put(
        keys.incident(JOB, "inc-0002-bbbbbb"),
        Incident(
            id="inc-0002-bbbbbb",
            job=JOB,
            failure_class=FailureEvent.WORKER_CRASH,
            generation=2,
            node="node-b",
            rank=3,
            exit_code=-9,
            action="restart",
            runbook="cpu_oom",
            failed_at=NOW - 30,
            detected_at=NOW - 29,
        ),
    )
    s.put(
        keys.checkpoint_entry(JOB, 110),
        CheckpointEntry(step=110, uri="/ckpt/step-0000000110", committed_at=NOW - 20, tiers=["memory", "file"]),
    )
    yield s
    s.delete_prefix(keys.job_prefix(JOB))
    s.delete(keys.cordon("spare-7"))
    s.close()


def stalwart(store: Store, *args: str, input: str | None = None):  # type: ignore[no-untyped-def]
    return runner.invoke(app, [*args, "--etcd", store.endpoint], input=input, env={"COLUMNS": "160"})


@pytest.fixture
def controller_side(store: Store) -> Iterator[Callable[[Callable[[OperatorRequest], OperatorRequest]], None]]:
    """Answers the job's pending requests with `answer(request)`, as the controller does; stopped at the end."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(answer: Callable[[OperatorRequest], OperatorRequest]) -> None:
        def loop() -> None:
            while not stop.wait(0.1):
                for req in store.get_prefix(keys.requests_prefix(JOB), OperatorRequest):
                    if req.status is RequestStatus.PENDING:
                        store.put(keys.request(JOB, req.id), answer(req))

        t = threading.Thread(target=loop, daemon=True)
        t.start()
        threads.append(t)

    yield start
    stop.set()
    for t in threads:
        t.join(timeout=5)
    store.delete_prefix(keys.requests_prefix(JOB))


def test_jobs_lists_the_job_with_its_figures(store: Store) -> None:
    result = stalwart(store, "jobs", "-o", "json")
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout) if r["job"] == JOB)
    assert row["phase"] == "Running" and row["generation"] == 2 and row["restarts"] == 1
    assert row["incidents"] == 2 and row["nodes_up"] == 1 and row["nodes_total"] == 2
    assert 0 < row["ettr"] < 1 and row["age_seconds"] >= 600
    table = stalwart(store, "jobs")
    assert JOB in table.stdout and "Running" in table.stdout and "ETTR" in table.stdout


def test_status_shows_nodes_ranks_health_standbys_and_incidents(store: Store) -> None:
    report = json.loads(stalwart(store, "status", JOB, "-o", "json").stdout)
    nodes = {n["node"]: n for n in report["nodes"]}
    assert nodes["node-a"]["state"] == "up" and nodes["node-a"]["ranks"] == [0, 1]
    assert nodes["node-b"]["state"] == "lost" and nodes["node-b"]["machine_faults"] == ["disk_full"]
    assert nodes["node-c"]["state"] == "standby" and nodes["node-x"]["state"] == "evicted"
    health = {r["rank"]: r["health"] for r in report["ranks"]}
    assert health == {0: "ok", 1: "stalled", 2: "ok", 3: "crashed"}
    assert report["standbys"] == ["node-c"] and report["last_checkpoint"]["step"] == 110
    assert [i["id"] for i in report["incidents"]] == ["inc-0001-aaaaaa", "inc-0002-bbbbbb"]
    table = stalwart(store, "status", JOB).stdout
    for text in (
        "node-a",
        "lost",
        "standby pool: node-c",
        "stalled",
        "crashed (-9)",
        "inc-0002-bbbbbb",
        "disk_full",
        "step 110 (memory+file)",
    ):
        assert text in table, text


def test_incidents_link_each_to_its_runbook(store: Store) -> None:
    rows = json.loads(stalwart(store, "incidents", JOB, "-o", "json").stdout)
    assert [(r["id"], r["runbook"]) for r in rows] == [("inc-0001-aaaaaa", "hang"), ("inc-0002-bbbbbb", "cpu_oom")]
    assert rows[0]["downtime_seconds"] == pytest.approx(100, abs=0.01) and rows[1]["recovered"] is False
    only = json.loads(stalwart(store, "incidents", "--class", "hang", "-o", "json").stdout)
    assert [r["id"] for r in only if r["job"] == JOB] == ["inc-0001-aaaaaa"]
    table = stalwart(store, "incidents", JOB).stdout
    assert "ongoing" in table and "cpu_oom" in table and "WorkerCrash" in table


def test_incident_shows_timeline_evidence_verdict_and_runbook(store: Store) -> None:
    result = stalwart(store, "incident", "0001-aaa")  # a unique prefix, without 'inc-'
    assert result.exit_code == 0, result.output
    text = result.stdout
    for expected in (
        "inc-0001-aaaaaa",
        "Hang",
        "timeline",
        "+61.00s",
        "no progress for 61s",
        "node-x → node-b",
        "outlier",
        "_injected_hang",
        "dp group 1",
        "stalwart runbook show hang",
        "0.95",
    ):
        assert expected in text, expected
    data = json.loads(stalwart(store, "incident", "inc-0002-bbbbbb", "-o", "json").stdout)
    assert data["runbook"] == "cpu_oom" and data["exit_code"] == -9
    ambiguous = stalwart(store, "incident", "inc-000", "--job", JOB)
    assert ambiguous.exit_code == 1 and "ambiguous" in ambiguous.stderr


def test_logs_fall_back_to_the_tail_a_heartbeat_kept(store: Store) -> None:
    """node-b does not answer (its agent is gone): the exited rank's tail from its last heartbeat is shown."""
    result = stalwart(store, "logs", JOB, "--rank", "3", "--timeout", "1")
    assert result.exit_code == 0, result.output
    assert "Out of memory: Killed process 1003" in result.stdout and "no answer from node-b" in result.stderr
    missing = stalwart(store, "logs", JOB, "--rank", "9")
    assert missing.exit_code == 1 and "no rank 9" in missing.stderr


def test_evict_asks_first_and_does_nothing_without_a_yes(store: Store) -> None:
    result = stalwart(store, "node", "evict", "node-a", input="n\n")
    assert result.exit_code == 1 and "not confirmed" in result.stderr
    assert store.get_prefix(keys.requests_prefix(JOB), OperatorRequest) == []


def test_evict_is_carried_out_by_the_controller(store: Store, controller_side) -> None:  # type: ignore[no-untyped-def]
    controller_side(
        lambda r: r.model_copy(
            update={
                "status": RequestStatus.DONE,
                "finished_at": time.time(),
                "message": f"evicted {r.node}; node-c took its ranks",
            }
        )
    )
    result = stalwart(store, "node", "evict", "node-a", "--reason", "Xid 79", input="y\n")  # the job is found by itself
    assert result.exit_code == 0, result.output
    assert "Done" in result.stdout and "evicted node-a; node-c took its ranks" in result.stdout
    [req] = store.get_prefix(keys.requests_prefix(JOB), OperatorRequest)
    assert (req.kind, req.node, req.reason, req.status) == (RequestKind.EVICT, "node-a", "Xid 79", RequestStatus.DONE)
    assert "stalwart CLI" in req.requested_by


def test_a_request_nobody_answers_is_withdrawn(store: Store) -> None:
    result = stalwart(store, "node", "cordon", "node-a", "--job", JOB, "--yes", "--timeout", "1")
    assert result.exit_code == 4 and "did not answer" in result.stderr
    [req] = store.get_prefix(keys.requests_prefix(JOB), OperatorRequest)
    assert req.status is RequestStatus.FAILED and req.message == WITHDRAWN
    store.delete_prefix(keys.requests_prefix(JOB))


def test_check_prints_the_controllers_results(store: Store, controller_side) -> None:  # type: ignore[no-untyped-def]
    """The result as the controller writes it for a check: {node: {passed, reasons}}."""
    result_body = {
        "node-a": {"passed": True, "reasons": []},
        "node-b": {"passed": False, "reasons": ["compute hash differs from the majority"]},
    }
    controller_side(
        lambda r: r.model_copy(
            update={"status": RequestStatus.DONE, "result": result_body, "message": "1/2 nodes passed; failed: node-b"}
        )
    )
    result = stalwart(store, "check", JOB, "--timeout", "30")
    assert result.exit_code == 0, result.output
    assert re.search(r"node-a[\s│]+yes", result.stdout), result.stdout
    assert re.search(r"node-b[\s│]+no[\s│]+compute hash differs", result.stdout), result.stdout
    assert "1/2 nodes passed; failed: node-b" in result.stdout
    [req] = store.get_prefix(keys.requests_prefix(JOB), OperatorRequest)
    assert req.kind is RequestKind.CHECK and req.node is None  # a job: every node
    as_json = stalwart(store, "check", "node-a", "--job", JOB, "-o", "json", "--timeout", "30")
    assert json.loads(as_json.stdout)["node"] == "node-a"


def test_a_request_the_controller_refuses_is_a_failure(store: Store, controller_side) -> None:  # type: ignore[no-untyped-def]
    controller_side(
        lambda r: r.model_copy(
            update={"status": RequestStatus.FAILED, "message": f"node {r.node!r} is not part of job {JOB}"}
        )
    )
    result = stalwart(store, "node", "evict", "node-x", "--job", JOB, "--yes")
    assert result.exit_code == 1 and "Failed" in result.stdout and "is not part of job" in result.stdout


def test_cordon_outside_any_job_writes_the_cordon_itself(store: Store) -> None:
    result = stalwart(store, "node", "cordon", "spare-7", "--reason", "fan failure", "--yes")
    assert result.exit_code == 0, result.output
    cordon = store.get(keys.cordon("spare-7"), Cordon)
    assert cordon is not None and cordon.reason == "fan failure"
    listed = json.loads(stalwart(store, "node", "list", "-o", "json").stdout)
    assert {"node": "spare-7", "state": "cordoned", "cordoned": "fan failure"}.items() <= next(
        r for r in listed if r["node"] == "spare-7"
    ).items()
    assert {r["node"] for r in listed if r["job"] == JOB} == {"node-a", "node-b", "node-c", "node-x"}
    assert stalwart(store, "node", "uncordon", "spare-7", "--yes").exit_code == 0
    assert store.get(keys.cordon("spare-7"), Cordon) is None
    again = stalwart(store, "node", "uncordon", "spare-7")
    assert again.exit_code == 0 and "not cordoned" in again.stderr


def test_evict_outside_any_job_says_what_to_do_instead(store: Store) -> None:
    result = stalwart(store, "node", "evict", "spare-8", "--yes")
    assert result.exit_code == 1 and "stalwart node cordon spare-8" in result.stderr


def test_the_diagnosis_service_is_found_by_flag_env_config_then_etcd(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stalwart.ops.connection import CONFIG_ENV, DIAGNOSIS_ENV
    from stalwart.ops.stacks import service_url
    from stalwart.store.records import ServiceEndpoint

    monkeypatch.delenv(DIAGNOSIS_ENV, raising=False)
    monkeypatch.setenv(CONFIG_ENV, "/nonexistent/config.yaml")
    key = keys.service("diagnosis")
    before = store.get_raw(key)  # `stalwart run` may have published its own: put it back after
    try:
        store.delete(key)
        assert service_url(store, None) == (None, "none configured or published")
        store.put(key, ServiceEndpoint(name="diagnosis", url="http://published:1/", registered_at=NOW))
        assert service_url(store, None) == ("http://published:1", "published in etcd")
        monkeypatch.setenv(DIAGNOSIS_ENV, "http://env:2")
        assert service_url(store, None) == ("http://env:2", DIAGNOSIS_ENV)
        assert service_url(store, "http://flag:3") == ("http://flag:3", "--diagnosis-url")
    finally:
        if before is None:
            store.delete(key)
        else:
            store.put(key, before.decode())


def test_listings_read_no_heartbeat_and_no_stack_report(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """`stalwart jobs` and `incidents` find jobs by skipping from one job's keys to the next, count
    nodes from a keys-only listing, and read no node record's value (issue 23: at 10,000 nodes
    those are tens of MB)."""
    from stalwart.ops import status as status_reader

    report_key = keys.stack_report(JOB, "stk-1", "node-a")
    store.put(report_key, "x" * 1000)
    reads: list[tuple[str, bool]] = []
    read_prefix = Store.read_prefix

    def recording(self: Store, prefix: str, *, keys_only: bool = False):  # type: ignore[no-untyped-def]
        reads.append((prefix, keys_only))
        return read_prefix(self, prefix, keys_only=keys_only)

    monkeypatch.setattr(Store, "read_prefix", recording)
    try:
        row = next(r for r in json.loads(stalwart(store, "jobs", "-o", "json").stdout) if r["job"] == JOB)
        assert (row["nodes_up"], row["nodes_total"], row["incidents"]) == (1, 2, 2)
        assert len(json.loads(stalwart(store, "incidents", "-o", "json").stdout)) >= 2
        valued = [prefix for prefix, keys_only in reads if not keys_only]
        assert not [p for p in valued if "/nodes/" in p or "/stacks/" in p or p == keys.jobs_prefix()], valued
        # A job bigger than DETAIL_NODES: its status reads no heartbeat either, and lists no rank.
        reads.clear()
        monkeypatch.setattr(status_reader, "DETAIL_NODES", 1)
        report = json.loads(stalwart(store, "status", JOB, "-o", "json").stdout)
        states = {n["node"]: n["state"] for n in report["nodes"]}
        assert states["node-a"] == "up" and states["node-b"] == "lost" and states["node-c"] == "standby"
        assert report["detail"] is False and report["ranks"] == []
        assert not [p for p, keys_only in reads if not keys_only and "/nodes/" in p]
        assert "no heartbeat was read" in stalwart(store, "status", JOB).stdout
    finally:
        store.delete(report_key)
