"""The worker SDK's progress reports survive a busy agent: a Unix datagram queue holds only a few
(net.unix.max_dgram_qlen), and the newest step must still arrive, or a finished job would look
stopped short (the e2e hot-swap test once saw a job succeed "at step 46" of 60 under load)."""

from __future__ import annotations

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
    first = [r.step for r in inbox.drain()]
    assert first and first == sorted(first) and len(first) < 100  # the queue took what it holds
    worker_sdk._send(step(101))  # room again: what waited goes, then this one
    assert [r.step for r in inbox.drain()][-1] == 101
    for n in range(102, 201):
        worker_sdk._send(step(n))
    inbox.drain()
    worker_sdk._flush_at_exit()  # the worker's exit: the last report still arrives
    assert [r.step for r in inbox.drain()] == [200]
    assert worker_sdk._unsent == {}
