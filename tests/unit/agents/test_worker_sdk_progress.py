"""The worker SDK's progress reports survive a busy agent: a Unix datagram queue holds only a few
(net.unix.max_dgram_qlen), and the newest step must still arrive, or a finished job would look
stopped short (the e2e hot-swap test once saw a job succeed "at step 46" of 60 under load)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from stalwart import worker_contract as contract
from stalwart.agents import worker_sdk
from stalwart.agents.progress_inbox import ProgressInbox
from stalwart.store.records import ProgressReport


@pytest.fixture
def inbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProgressInbox]:
    box = ProgressInbox()
    monkeypatch.setenv(contract.PROGRESS_SOCKET, box.path)
    monkeypatch.setattr(worker_sdk, "_sock", None)
    monkeypatch.setattr(worker_sdk, "_unsent", {})
    try:
        yield box
    finally:
        if worker_sdk._sock is not None:
            worker_sdk._sock.close()
        box.close()


def step(n: int) -> ProgressReport:
    return ProgressReport(kind="step", rank=0, local_rank=0, step=n, loss=1.0 / n, sent_at=time.time())


def test_the_newest_step_waits_for_a_full_queue_and_goes_at_the_next_report_or_at_exit(inbox: ProgressInbox) -> None:
    for n in range(1, 101):  # the agent drains nothing meanwhile: its queue fills; no call blocks
        worker_sdk._send(step(n))
    worker_sdk.flush()  # (what the sender thread does every round)
    first = [r.step for r in inbox.drain()]
    assert first and first == sorted(first) and len(first) < 100  # the queue took what it holds
    worker_sdk._send(step(101))  # room again: what waited goes, then this one
    worker_sdk.flush()
    assert [r.step for r in inbox.drain()][-1] == 101
    for n in range(102, 201):
        worker_sdk._send(step(n))
    worker_sdk.flush()
    inbox.drain()
    worker_sdk._flush_at_exit()  # the worker's exit: the last report still arrives
    assert [r.step for r in inbox.drain()] == [200]
    assert worker_sdk._unsent == {}


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
    build = worker_sdk._step_report

    def watched(entry: worker_sdk.StepEntry) -> ProgressReport:
        builders.add(threading.current_thread().name)
        return build(entry)

    monkeypatch.setattr(worker_sdk, "_step_report", watched)
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
