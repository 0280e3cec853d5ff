"""A hang's stack capture at scale: it waits while answers still come, and a capture that many nodes
did not answer blames none of them (a few silent nodes are still the likeliest culprits)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from support.controller_harness import assignment_of

from stalwart.controller.shell import diagnosis as diagnosis_link
from stalwart.logs import get_logger
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import StackReport

DUMP = """Thread 4242 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2100)
    step (train.py:9)
    <module> (train.py:20)
"""


def report(node: str, request_id: str = "r") -> StackReport:
    """Every rank waits in the same all-reduce: the stacks single no one out."""
    first = int(node.rsplit("-", 1)[1]) * 2
    stacks = [{"rank": first + i, "text": DUMP, "method": "py-spy"} for i in range(2)]
    return StackReport(request_id=request_id, node=node, generation=1, captured_at=0.0, stacks=stacks)


@pytest.mark.parametrize("silent", [1, diagnosis_link.MISSING_BLAMED_NODES, diagnosis_link.MISSING_BLAMED_NODES + 1, 9])
def test_silent_nodes_are_suspects_only_when_few(silent: int, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [f"node-{i}" for i in range(40)]
    answered = nodes[silent:]
    monkeypatch.setattr(diagnosis_link, "request_stacks", lambda store, job: "r")
    monkeypatch.setattr(diagnosis_link, "collect_stacks", lambda *a, **k: [report(n) for n in answered])
    found = diagnosis_link.diagnose_hang(None, "j", assignment_of(nodes), None, get_logger("test"))  # type: ignore[arg-type]
    if silent <= diagnosis_link.MISSING_BLAMED_NODES:
        assert found.suspects == nodes[:silent]
    else:
        assert found.suspects == []
        assert any(f"no stack report from {silent} nodes" in line for line in found.evidence), found.evidence


@pytest.fixture
def answering(store: Store) -> Iterator[tuple[Store, list[str]]]:
    nodes = [f"node-{i}" for i in range(12)]
    yield store, nodes
    store.delete_prefix(keys.stacks_prefix("j", "slow"))


def test_a_capture_waits_past_its_timeout_while_answers_still_come(
    answering: tuple[Store, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The nodes answer one by one over longer than the timeout: the capture takes them all."""
    store, nodes = answering
    monkeypatch.setattr(diagnosis_link, "STACK_QUIET_SECONDS", 30.0)  # a stalled writer is not a quiet capture
    seen = threading.Event()

    def answer() -> None:
        for n in nodes:
            store.put(keys.stack_report("j", "slow", n), report(n, "slow").dumps())
            seen.wait(0.05)

    writer = threading.Thread(target=answer, daemon=True)
    writer.start()
    try:
        got = diagnosis_link.collect_stacks(store, "j", "slow", nodes, timeout=0.01)
    finally:
        seen.set()
        writer.join()
    assert [r.node for r in got] == sorted(nodes)
