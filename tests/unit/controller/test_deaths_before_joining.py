"""A slot node that dies before it joins is replaced, a few times per slot; a start that cannot succeed
(every agent dies at once: a bad setting, a missing directory) fails the job saying so, instead of
starting node after node until the startup timeout."""

from __future__ import annotations

from support.controller_harness import Harness

from stalwart.cluster.base import NodeInfo
from stalwart.controller.core.reconcile import DEATHS_BEFORE_JOINING_PER_SLOT
from stalwart.runbooks import load_runbook
from stalwart.store.records import JobStage


def kill(h: Harness, node: str) -> None:
    h.cluster.nodes[node] = NodeInfo(name=node, alive=False)


def test_a_node_that_keeps_dying_before_joining_is_replaced_until_the_start_cannot_succeed() -> None:
    h = Harness()
    h.put_state(stage=JobStage.STARTING, next_node_index=2)
    h.join("node-0")
    limit = DEATHS_BEFORE_JOINING_PER_SLOT * 2
    for death in range(1, limit + 1):
        dying = h.state().slots[1]
        kill(h, dying)
        h.tick()
        state = h.state()
        assert state.stage is JobStage.STARTING and state.died_before_joining == death
        assert state.slots[0] == "node-0" and state.slots[1] not in (dying, "node-1")  # a fresh node in its slot
    kill(h, h.state().slots[1])
    h.tick()
    state = h.state()
    assert state.stage is JobStage.FAILED and state.reason == "NodesDiedBeforeJoining"
    assert f"{limit + 1} slot nodes died before they joined" in (state.message or "")
    assert "agent log says why" in (state.message or "")
    assert load_runbook(state.reason).id == "nodes_died_before_joining"  # the runbook the message names


def test_the_count_starts_again_with_each_generation() -> None:
    h = Harness()
    h.put_state(stage=JobStage.STARTING, next_node_index=2)
    h.join("node-0")
    kill(h, "node-1")
    h.tick()
    replacement = h.state().slots[1]
    assert h.state().died_before_joining == 1
    h.join(replacement)
    h.tick()
    state = h.state()
    assert state.stage is JobStage.RUNNING and state.generation == 1 and state.died_before_joining == 0
