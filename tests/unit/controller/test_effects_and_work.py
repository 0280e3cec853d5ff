"""The actuator (effects after a commit) and the thread runner (long work off the loop)."""

from __future__ import annotations

import threading

from support.fakes import FakeClock, FakeCluster, ManualRunner, MemoryStore

from stalwart.controller.core.decision import CordonNode, FenceNode, Launch, SendCommand, StartNode, UncordonNode
from stalwart.controller.core.work import NodeChecks, WorkResult
from stalwart.controller.shell.actuator import Actuator
from stalwart.controller.shell.work import ThreadRunner
from stalwart.logs import get_logger
from stalwart.processes import wait_for
from stalwart.store import keys
from stalwart.store.records import AgentAction, AgentCommand


class Flaky(FakeCluster):
    def start_node(self, name: str) -> None:
        raise RuntimeError("the API server said no")


def test_a_failing_effect_is_logged_and_the_others_still_run() -> None:
    store, clock = MemoryStore(), FakeClock()
    cluster = Flaky()
    actuator = Actuator(store, cluster, "j", ManualRunner(clock), clock)
    actuator.apply([StartNode("node-0"), SendCommand("node-1", 3, AgentAction.RUN)], get_logger("test"))
    command = store.get(keys.node_command("j", "node-1"), AgentCommand)
    assert command is not None and (command.generation, command.action) == (3, AgentAction.RUN)


def test_cordons_and_fences_are_done_once_and_an_uncordoned_node_stays_uncordoned() -> None:
    store, clock, cluster = MemoryStore(), FakeClock(), FakeCluster()
    runner = ManualRunner(clock)
    actuator = Actuator(store, cluster, "j", runner, clock)
    lease = store.lease(5)
    log = get_logger("test")
    effects = [
        CordonNode("node-1", "evicted"),
        FenceNode("node-1", lease.id, "gone"),
        FenceNode("node-1", lease.id, "gone"),
    ]
    actuator.apply(effects, log)
    actuator.apply([CordonNode("node-1", "evicted"), UncordonNode("node-2"), CordonNode("node-2", "evicted")], log)
    assert cluster.calls == [("cordon", "node-1"), ("uncordon", "node-2")]
    work = NodeChecks("standby", "node-3", ("node-3",), 1)
    actuator.apply([Launch(work), Launch(work)], log)
    assert runner.launched == [work]


def test_the_thread_runner_runs_each_key_once_and_wakes_the_loop() -> None:
    wake, release = threading.Event(), threading.Event()
    work = NodeChecks("request", "r1", ("node-0",), 1)

    def perform(w: NodeChecks) -> WorkResult:  # type: ignore[override]
        release.wait(5)
        return WorkResult(w, 1.0)

    runner = ThreadRunner(perform, wake)  # type: ignore[arg-type]
    runner.launch(work)
    runner.launch(work)
    assert runner.in_flight() == frozenset({work.key}) and runner.take() == []
    release.set()
    assert wait_for(wake.is_set, 60)
    [result] = runner.take()
    assert result.key == work.key and runner.in_flight() == frozenset() and runner.take() == []
