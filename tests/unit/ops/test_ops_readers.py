"""The operations layer over a real etcd, for what the CLI's and the console's tests do not reach:
logs and stacks answered by the agents' side of the protocol, incident lookup by id or prefix, and
an operator request's wait that runs out.

A small responder plays each agent: it watches the job's request key and writes its report, as the
node agent does (stalwart.agents); it is stopped and joined at the end of each test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import pytest

from stalwart.ops import requests
from stalwart.ops.errors import EXIT_TIMEOUT, NotFound, OpsError
from stalwart.ops.logs import read_logs
from stalwart.ops.lookup import current_assignment, find_incident, require_state
from stalwart.ops.readable import duration, nodes_of, rank_ranges
from stalwart.ops.stacks import capture, run_diagnosis
from stalwart.spec.model import FailureEvent
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import (
    Assignment,
    Heartbeat,
    Incident,
    JobPhase,
    JobStage,
    JobState,
    LogReport,
    LogRequest,
    NodeAssignment,
    RequestKind,
    RequestStatus,
    StackReport,
    StackRequest,
    WorkerLog,
    WorkerState,
    WorkerStatus,
)

JOB = "ops-readers"
NODES = ("node-a", "node-b")


@pytest.fixture(scope="module")
def store(etcd: EtcdServer) -> Iterator[Store]:
    """A running job in generation 1: ranks 0-1 on node-a, 2-3 on node-b; rank 3 exited with a kept tail."""
    now = time.time()
    s = Store(etcd.endpoint)
    s.delete_prefix(keys.job_prefix(JOB))
    s.put(
        keys.job_state(JOB),
        JobState(
            job=JOB,
            phase=JobPhase.RUNNING,
            generation=1,
            slots=list(NODES),
            created_at=now - 60,
            updated_at=now,
        ),
    )
    s.put(
        keys.generation(JOB, 1),
        Assignment(
            job=JOB,
            generation=1,
            world_size=4,
            master_addr="127.0.0.1",
            master_port=1,
            created_at=now - 50,
            nodes=[
                NodeAssignment(node=node, node_rank=i, role="trainer", first_rank=2 * i, local_world_size=2)
                for i, node in enumerate(NODES)
            ],
        ),
    )
    exited = WorkerStatus(
        local_rank=1,
        rank=3,
        pid=1003,
        state=WorkerState.EXITED,
        exit_code=1,
        started_at=now - 50,
        exited_at=now - 5,
        log_tail=["step 9", "RuntimeError: boom"],
    )
    s.put(keys.node_heartbeat(JOB, "node-a"), Heartbeat(node="node-a", generation=1, sent_at=now))
    s.put(keys.node_heartbeat(JOB, "node-b"), Heartbeat(node="node-b", generation=1, sent_at=now, workers=[exited]))
    for number, suffix in ((1, "aaaa11"), (2, "aaaa22"), (3, "bbbb33")):
        incident_id = f"inc-000{number}-{suffix}"
        s.put(
            keys.incident(JOB, incident_id),
            Incident(
                id=incident_id,
                job=JOB,
                failure_class=FailureEvent.WORKER_CRASH,
                generation=1,
                action="restart",
                failed_at=now - 40 + number,
                detected_at=now - 39 + number,
            ),
        )
    yield s
    s.delete_prefix(keys.job_prefix(JOB))
    s.close()


@contextmanager
def agents_answering(store: Store, answer: Callable[[], bool]) -> Iterator[None]:
    """Run `answer` (True once it has answered) until it has, or the test ends; joined on the way out."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set() and not answer():
            stop.wait(0.05)

    thread = threading.Thread(target=loop, name="ops-test-agents", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def test_logs_come_from_the_agents_that_answer_and_the_heartbeat_of_the_one_that_does_not(store: Store) -> None:
    def node_a_answers() -> bool:
        request = store.get(keys.log_request(JOB), LogRequest)
        if request is None:
            return False
        lines = [WorkerLog(rank=r, local_rank=r, lines=[f"rank {r} line {i}" for i in range(5)]) for r in (0, 1)]
        report = LogReport(request_id=request.id, node="node-a", generation=1, workers=lines)
        store.put(keys.log_report(JOB, request.id, "node-a"), report)
        return True

    store.delete(keys.log_request(JOB))
    notes: list[str] = []
    with agents_answering(store, node_a_answers):
        found = read_logs(store, JOB, None, lines=3, timeout=2.0, on_note=notes.append)
    assert [(r.rank, r.node, r.source) for r in found] == [
        (0, "node-a", "agent"),
        (1, "node-a", "agent"),
        (3, "node-b", "heartbeat"),
    ]
    assert found[0].lines == ["rank 0 line 2", "rank 0 line 3", "rank 0 line 4"]  # the last `lines` of each
    assert found[2].exit_code == 1 and found[2].lines[-1] == "RuntimeError: boom"
    assert len(notes) == 1 and "node-b" in notes[0]
    request = store.get(keys.log_request(JOB), LogRequest)
    assert request is not None and store.get_prefix(keys.logs_prefix(JOB, request.id), LogReport) == []


def test_logs_ask_only_nodes_with_a_heartbeat_and_name_the_others(store: Store) -> None:
    beat = store.get(keys.node_heartbeat(JOB, "node-a"), Heartbeat)
    store.delete(keys.node_heartbeat(JOB, "node-a"))  # node-a's lease lapsed: nobody there to answer
    try:
        with pytest.raises(OpsError, match=r"1 of 1 node\(s\) have no heartbeat \(node-a\)"):
            read_logs(store, JOB, 0, lines=10, timeout=600.0)  # at once: no wait for a node that is gone
        found = read_logs(store, JOB, 3, lines=10, timeout=0.5)  # node-b's exited rank: its heartbeat's tail
        assert [(r.rank, r.source) for r in found] == [(3, "heartbeat")]
    finally:
        store.put(keys.node_heartbeat(JOB, "node-a"), beat)


def test_logs_of_an_ended_job_whose_agents_stopped_say_where_the_output_is(store: Store) -> None:
    state = require_state(store, JOB)
    beats = {node: store.get(keys.node_heartbeat(JOB, node), Heartbeat) for node in NODES}
    store.put(keys.job_state(JOB), state.model_copy(update={"stage": JobStage.SUCCEEDED}))
    for node in NODES:
        store.delete(keys.node_heartbeat(JOB, node))
    try:
        with pytest.raises(OpsError, match=r"has ended \(Succeeded\) and its agents have stopped.*rank-R\.log"):
            read_logs(store, JOB, None, lines=10, timeout=600.0)
    finally:
        store.put(keys.job_state(JOB), state)
        for node, beat in beats.items():
            if beat is not None:
                store.put(keys.node_heartbeat(JOB, node), beat)


def test_logs_of_a_rank_the_job_lacks_are_not_found(store: Store) -> None:
    with pytest.raises(NotFound, match="no rank 9"):
        read_logs(store, JOB, 9, lines=10, timeout=1.0)


def test_stacks_are_captured_from_every_node_and_diagnosed_here(store: Store) -> None:
    def every_node_answers() -> bool:
        request = store.get(keys.stack_request(JOB), StackRequest)
        if request is None:
            return False
        for i, node in enumerate(NODES):
            dumps = [
                {"rank": r, "pid": 1000 + r, "method": "pyspy", "text": f"Thread {r}:\n    train (train.py:{10 + r})"}
                for r in (2 * i, 2 * i + 1)
            ]
            report = StackReport(request_id=request.id, node=node, generation=1, captured_at=time.time(), stacks=dumps)
            store.put(keys.stack_report(JOB, request.id, node), report)
        return True

    store.delete(keys.stack_request(JOB))
    state = require_state(store, JOB)
    assignment = current_assignment(store, state)
    with agents_answering(store, every_node_answers):
        taken = capture(store, state, assignment, "auto", (1, 1, None), timeout=30.0)
    assert taken.silent == []
    assert sorted((s.rank, s.node) for s in taken.bundle.stacks) == [
        (0, "node-a"),
        (1, "node-a"),
        (2, "node-b"),
        (3, "node-b"),
    ]
    topology = taken.bundle.topology
    assert topology is not None and (topology.tp, topology.pp, topology.dp) == (1, 1, 4)
    notes: list[str] = []
    verdict, by = run_diagnosis(taken.bundle, "http://127.0.0.1:9", "a test", True, on_note=notes.append)
    assert by == "the local engine" and notes == []  # --local: the service is not asked
    assert verdict.job == JOB


def test_a_layout_that_does_not_divide_the_world_is_a_usage_error(store: Store) -> None:
    state = require_state(store, JOB)
    with pytest.raises(OpsError, match="does not divide") as refused:
        capture(store, state, current_assignment(store, state), "auto", (3, 1, None), timeout=1.0)
    assert refused.value.code == 2


@pytest.mark.parametrize(
    ("given", "found"),
    [("inc-0001-aaaa11", "inc-0001-aaaa11"), ("0002-aaaa22", "inc-0002-aaaa22"), ("0003", "inc-0003-bbbb33")],
)
def test_an_incident_is_found_by_id_without_its_prefix_or_by_a_unique_start(
    store: Store, given: str, found: str
) -> None:
    assert find_incident(store, given, JOB).id == found
    assert find_incident(store, given, None).id == found  # in every job


def test_an_ambiguous_or_unknown_incident_says_what_there_is(store: Store) -> None:
    with pytest.raises(OpsError, match="ambiguous: ops-readers/inc-0001-aaaa11, ops-readers/inc-0002-aaaa22"):
        find_incident(store, "000", JOB)
    with pytest.raises(NotFound, match="no incident '9999' in job 'ops-readers'"):
        find_incident(store, "9999", JOB)
    with pytest.raises(NotFound, match=f"jobs there: .*{JOB}"):
        require_state(store, "no-such-job")


def test_a_request_nobody_answers_is_withdrawn_after_the_wait_shown(store: Store) -> None:
    shown: list[str] = []

    def waiting(what: str) -> AbstractContextManager[Any]:
        shown.append(what)
        return nullcontext()

    request = requests.submit(store, JOB, RequestKind.CHECK, "node-a", "a test")
    try:
        with pytest.raises(OpsError, match="did not answer request") as refused:
            requests.wait(store, JOB, request, timeout=0.5, waiting=waiting)
        assert refused.value.code == EXIT_TIMEOUT
        assert len(shown) == 1 and "check node-a in ops-readers" in shown[0]
        final = store.get(keys.request(JOB, request.id), type(request))
        assert final is not None and final.status is RequestStatus.FAILED and final.message == requests.WITHDRAWN
    finally:
        store.delete_prefix(keys.requests_prefix(JOB))


def test_readable_values_are_short_and_bounded() -> None:
    assert [duration(s) for s in (None, 3.21, 42, 245, 11_520, 187_200)] == [
        "-",
        "3.2s",
        "42s",
        "4m05s",
        "3h12m",
        "2d04h",
    ]
    assert rank_ranges([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8" and rank_ranges([]) == "-"
    owners = {r: f"node-{r // 2}" for r in range(20)}
    assert nodes_of([0, 1, 2], owners) == " on node-0, node-1"
    assert nodes_of(range(20), owners).endswith("+6 nodes")
