"""The worker SDK's progress reports survive a busy agent: a Unix datagram queue holds only a few
(net.unix.max_dgram_qlen), and the newest step must still arrive, or a finished job would look
stopped short (the e2e hot-swap test once saw a job succeed "at step 46" of 60 under load)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from stalwart import worker_contract as contract
from stalwart.agents import worker_sdk
from stalwart.agents.progress_inbox import ProgressInbox
from stalwart.store.records import PhaseTimes, ProgressReport


@pytest.fixture
def inbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProgressInbox]:
    box = ProgressInbox()
    monkeypatch.setenv(contract.PROGRESS_SOCKET, box.path)
    monkeypatch.setattr(worker_sdk, "_sock", None)
    monkeypatch.setattr(worker_sdk, "_unsent", [])
    try:
        yield box
    finally:
        if worker_sdk._sock is not None:
            worker_sdk._sock.close()
        box.close()


def step(n: int) -> ProgressReport:
    return ProgressReport(kind="step", rank=0, local_rank=0, step=n, loss=1.0 / n, sent_at=time.time())


def fill(inbox: ProgressInbox) -> None:
    """The agent drains nothing meanwhile: its queue fills (with datagrams it will skip)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as other:
        other.setblocking(False)
        while True:
            try:
                other.sendto(b"{}", inbox.path)
            except BlockingIOError:
                return


def test_the_newest_step_waits_for_a_full_queue_and_goes_at_the_next_report_or_at_exit(inbox: ProgressInbox) -> None:
    fill(inbox)
    for n in range(1, 101):  # no call blocks
        worker_sdk._send(step(n))
    worker_sdk.flush()  # (what the sender thread does every round)
    # Only the newest step waited: draining the queue makes room, and the sender thread may send it then.
    got = [r.step for r in inbox.drain()]
    assert got in ([], [100])
    worker_sdk._send(step(101))  # room again: what waited goes, then this one
    worker_sdk.flush()
    assert got + [r.step for r in arrived(inbox, 2 - len(got))] == [100, 101]
    fill(inbox)
    for n in range(102, 201):
        worker_sdk._send(step(n))
    worker_sdk.flush()
    got = [r.step for r in inbox.drain()]
    worker_sdk._flush_at_exit()  # the worker's exit: the last report still arrives
    assert got + [r.step for r in inbox.drain()] == [200]
    assert worker_sdk._unsent == []


def test_a_round_sends_what_piled_up_in_one_datagram_a_report_a_line(inbox: ProgressInbox) -> None:
    """One send per round however many steps it carries (a node's workers share the agent's queue of
    about 10 datagrams): every step arrives, in order, and a large round is split under the limit."""
    for n in range(1, 401):
        worker_sdk._outbox.append((n, 1.0 / n, 8, None, 0.01, time.time(), None))
    assert worker_sdk.flush()
    assert [r.step for r in inbox.drain()] == list(range(1, 401))


def arrived(inbox: ProgressInbox, count: int) -> list[ProgressReport]:
    """Every report until `count` have come (the sender's rounds are its own: wait for the state)."""
    reports: list[ProgressReport] = []
    deadline = time.monotonic() + 60
    while len(reports) < count and time.monotonic() < deadline:
        reports += inbox.drain()
        time.sleep(0.01)
    return reports


def test_the_training_thread_only_queues_a_step_the_sender_thread_builds_and_sends_it_in_order(
    inbox: ProgressInbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    builders: set[str] = set()
    build = worker_sdk._step_json

    def watched(entry: worker_sdk.StepEntry, sender: dict[str, int | None]) -> tuple[str, bytes]:
        builders.add(threading.current_thread().name)
        return build(entry, sender)

    monkeypatch.setattr(worker_sdk, "_step_json", watched)
    for n in range(1, 6):
        worker_sdk.report_step(n, loss=1.0 / n, tokens=8, data_time=0.01, compute_time=0.02)
    worker_sdk.report_checkpoint(5)  # behind the steps before it
    worker_sdk.report_step(6, loss=0.1)
    reports = arrived(inbox, 7)
    assert [(r.kind, r.step) for r in reports] == [("step", n) for n in range(1, 6)] + [("checkpoint", 5), ("step", 6)]
    assert builders == {"stalwart-progress"}  # never the training thread
    assert reports[1].phases is not None and reports[1].phases.compute == 0.02 and reports[1].phases.other is not None
    assert reports[0].sent_at <= reports[4].sent_at  # when the step was reported, not when it went


def test_a_report_that_cannot_be_built_is_dropped_and_training_goes_on(inbox: ProgressInbox) -> None:
    worker_sdk.report_step(1, tokens="many")  # type: ignore[arg-type]  # the records refuse it, on the sender
    worker_sdk.report_step(2, tokens=8)
    assert [r.step for r in arrived(inbox, 1)] == [2]


def test_a_nan_loss_still_stops_the_step_on_the_training_thread(inbox: ProgressInbox) -> None:
    worker_sdk.report_step(1, loss=2.0)
    with pytest.raises(FloatingPointError, match="loss is nan at step 2"):
        worker_sdk.report_step(2, loss=float("nan"))
    worker_sdk.flush()
    assert [r.step for r in inbox.drain()] == [1]  # the NaN step is never reported


def test_a_step_serialised_by_the_sdk_is_the_record_the_agent_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sender writes step reports with json, not the pydantic models: what it writes must be what
    ProgressReport would have made of the same values, integer-likes and float-likes coerced alike."""
    monkeypatch.setenv(contract.RANK, "3")
    monkeypatch.setenv(contract.LOCAL_RANK, "1")
    monkeypatch.setenv(contract.GENERATION, "2")
    phases = {
        "data": 0.001,
        "compute": np.float32(0.02),
        "optimizer": None,
        "comm": None,
        "other": 0.003,
        "saving": True,
        "cpu_wait": {"data": 0.0004},
    }
    entry: worker_sdk.StepEntry = (np.int64(7), 1.25, np.int64(256), 3e12, 0.03, 1700000000.5, phases)  # type: ignore[assignment]
    kind, payload = worker_sdk._step_json(entry, worker_sdk._identity())
    expected = ProgressReport(
        kind="step",
        rank=3,
        local_rank=1,
        generation=2,
        step=7,
        loss=1.25,
        tokens=256,
        flops=3e12,
        step_time=0.03,
        sent_at=1700000000.5,
        phases=PhaseTimes(**{**phases, "compute": float(np.float32(0.02))}),
    )
    assert kind == "step" and ProgressReport.loads(payload) == expected
    no_phases: worker_sdk.StepEntry = (8, None, None, None, None, 1700000001.0, None)
    assert ProgressReport.loads(worker_sdk._step_json(no_phases, worker_sdk._identity())[1]) == ProgressReport(
        rank=3, local_rank=1, generation=2, step=8, sent_at=1700000001.0
    )
    with pytest.raises(TypeError):
        worker_sdk._step_json((9, None, 2.5, None, None, 0.0, None), {})  # type: ignore[arg-type]  # a fractional token count


def test_the_sender_s_rounds_count_their_cpu(inbox: ProgressInbox) -> None:
    before = worker_sdk.sender_cpu()
    for n in range(1, 51):
        worker_sdk.report_step(n, loss=1.0, tokens=8, data_time=0.001, compute_time=0.002)
    assert [r.step for r in arrived(inbox, 50)] == list(range(1, 51))
    deadline = time.monotonic() + 60
    while worker_sdk.sender_cpu() == before and time.monotonic() < deadline:  # (the round ends after its sends)
        time.sleep(0.01)
    assert worker_sdk.sender_cpu() > before
