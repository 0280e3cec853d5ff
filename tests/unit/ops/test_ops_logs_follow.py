"""`logs -f` over a real etcd: each new line once, in order, until the job ends.

A responder plays the node agent: it answers every log request with the last lines its worker has
written so far (as an agent does, stalwart.agents), from a list the test appends to. The follow is a
generator, so the test writes new lines and finishes the job between two of its results.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.ops.logs import follow_logs, new_lines
from stalwart.store import Store, keys
from stalwart.store.etcd_server import EtcdServer
from stalwart.store.records import (
    Assignment,
    Heartbeat,
    JobPhase,
    JobState,
    LogReport,
    LogRequest,
    NodeAssignment,
    WorkerLog,
)

JOB = "ops-follow"


def job_state(phase: JobPhase) -> JobState:
    now = time.time()
    return JobState(job=JOB, phase=phase, generation=1, slots=["node-a"], created_at=now, updated_at=now)


@pytest.fixture
def store(etcd: EtcdServer) -> Iterator[Store]:
    s = Store(etcd.endpoint)
    s.delete_prefix(keys.job_prefix(JOB))
    s.put(keys.job_state(JOB), job_state(JobPhase.RUNNING))
    s.put(
        keys.generation(JOB, 1),
        Assignment(
            job=JOB,
            generation=1,
            world_size=1,
            master_addr="127.0.0.1",
            master_port=1,
            created_at=time.time(),
            nodes=[NodeAssignment(node="node-a", node_rank=0, role="trainer", first_rank=0, local_world_size=1)],
        ),
    )
    s.put(keys.node_heartbeat(JOB, "node-a"), Heartbeat(node="node-a", generation=1, sent_at=time.time()))
    yield s
    s.delete_prefix(keys.job_prefix(JOB))
    s.close()


@pytest.fixture
def written(store: Store) -> Iterator[list[str]]:
    """What rank 0 has written; an agent thread answers each log request with its tail, until the test ends."""
    lines: list[str] = []
    stop = threading.Event()

    def agent() -> None:
        answered: set[str] = set()
        while not stop.wait(0.05):
            request = store.get(keys.log_request(JOB), LogRequest)
            if request is None or request.id in answered:
                continue
            tail = WorkerLog(rank=0, local_rank=0, lines=list(lines[-request.lines :]))
            store.put(
                keys.log_report(JOB, request.id, "node-a"),
                LogReport(request_id=request.id, node="node-a", generation=1, workers=[tail]),
            )
            answered.add(request.id)

    thread = threading.Thread(target=agent, name="follow-test-agent", daemon=True)
    thread.start()
    yield lines
    stop.set()
    thread.join(timeout=10)


def test_new_lines_are_what_follows_the_previous_tail() -> None:
    assert new_lines([], ["a", "b"]) == ["a", "b"]
    assert new_lines(["a", "b"], ["a", "b", "c"]) == ["c"]
    assert new_lines(["a", "b", "c"], ["b", "c", "d", "e"]) == ["d", "e"]  # the tail moved on
    assert new_lines(["x", "x"], ["x", "x", "x"]) == ["x"]  # repeated lines: the longest overlap
    assert new_lines(["a", "b"], ["a", "b"]) == []
    assert new_lines(["a", "b"], ["q", "r"]) == ["q", "r"]  # nothing shared: all new


def test_follow_prints_each_new_line_once_and_ends_with_the_job(store: Store, written: list[str]) -> None:
    written.extend(f"step {i}" for i in range(5))
    follow = follow_logs(store, JOB, None, lines=3, timeout=10.0, interval=0.1)
    first = next(follow)
    assert (first.rank, first.lines) == (0, ["step 2", "step 3", "step 4"])  # the tail first
    written.extend(["step 5", "step 6"])
    assert next(follow).lines == ["step 5", "step 6"]
    written.append("step 7")
    store.put(keys.job_state(JOB), job_state(JobPhase.SUCCEEDED))
    rest = list(follow)  # ends: the job finished
    assert [line for r in rest for line in r.lines] == ["step 7"]


def test_logs_follow_on_the_command_line_ends_when_the_job_has(store: Store, written: list[str]) -> None:
    written.extend(["loading data", "step 1 loss 2.5", "done"])
    store.put(keys.job_state(JOB), job_state(JobPhase.SUCCEEDED))
    result = CliRunner().invoke(
        app, ["logs", JOB, "-f", "--tail", "2", "-o", "jsonpath={.lines[*]}", "--etcd", store.endpoint]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\n")[0] == "step 1 loss 2.5 done"
