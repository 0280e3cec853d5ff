"""The controller after an etcd outage (issue 16), on the in-memory fakes and a fake clock: leases
that lapsed because etcd was away are not lost nodes while the agents register again; a node that
does not come back within the grace is; a leadership that lapsed with etcd is taken again."""

from __future__ import annotations

import pytest
from support.controller_harness import Harness, worker

from stalwart.controller.core.policy import outage_grace
from stalwart.processes import wait_for
from stalwart.spec.model import FaultTolerance
from stalwart.store.client import LeaseLost, StoreUnavailable
from stalwart.store.records import JobStage

S = JobStage
GRACE = outage_grace(FaultTolerance(lease_ttl_seconds=5))  # the harness's job: leases of 5 s
SLOTS = ("node-0", "node-1")


def running_through_an_outage(seen_by_controller: bool = True) -> Harness:
    """Generation 1 running; etcd goes away for 10 s (the controller decides nothing meanwhile) and
    every lease lapses with it."""
    h = Harness()
    h.running(first_step_at=h.clock.now - 49)
    h.tick()
    if seen_by_controller:
        h.controller.etcd_outage.failed(h.clock.now, StoreUnavailable("etcd at 127.0.0.1:2379 timed out"))
    h.clock.advance(10)
    for node in SLOTS:
        h.lapse(node)
    if seen_by_controller:
        h.controller.etcd_outage.answered(h.clock.now)
    return h


def rejoin(h: Harness, *nodes: str) -> None:
    """The agents register again under new leases, same generation, workers still stepping."""
    h.join(*nodes, generation=1)
    for node in nodes:
        i = SLOTS.index(node)
        h.beat(node, 1, [worker(2 * i, at=h.clock.now), worker(2 * i + 1, at=h.clock.now)])


def test_nodes_whose_leases_lapsed_with_etcd_register_again_and_nothing_is_lost() -> None:
    h = running_through_an_outage()
    h.tick()
    assert h.state().stage is S.RUNNING and h.incidents() == []  # back, but nobody registered yet
    h.clock.advance(GRACE / 2)
    rejoin(h, "node-0")
    h.tick()
    h.clock.advance(1)
    rejoin(h, "node-1")
    h.tick()
    h.clock.advance(GRACE)
    h.tick()
    state = h.state()
    assert state.stage is S.RUNNING and state.generation == 1 and h.incidents() == []
    assert state.restarts == 0 and state.infra_restarts == 0


def test_a_node_that_does_not_come_back_within_the_grace_is_lost() -> None:
    h = running_through_an_outage()
    rejoin(h, "node-0")
    h.clock.advance(GRACE - 0.1)
    h.tick()
    assert h.incidents() == []
    h.clock.advance(0.2)
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "LostNode" and incident.suspects == ["node-1"]


def test_every_lease_lapsing_at_once_is_taken_for_an_outage_even_unseen() -> None:
    """A controller that never lost etcd (or started after the outage) sees every slot's lease lapse
    together: the signature of etcd expiring them, so the nodes get the same grace."""
    h = running_through_an_outage(seen_by_controller=False)
    h.tick()
    assert h.incidents() == []
    h.clock.advance(GRACE / 2)
    rejoin(h, *SLOTS)
    h.tick()
    h.clock.advance(GRACE)
    h.tick()
    assert h.incidents() == [] and h.state().generation == 1


def test_a_fresh_controller_that_finds_every_lease_gone_waits_the_grace_then_counts_them_lost() -> None:
    h = running_through_an_outage(seen_by_controller=False)
    h.new_controller()  # the one that ran before the outage is gone
    h.tick()
    assert h.incidents() == []
    h.clock.advance(GRACE + 0.1)
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "LostNode" and sorted(incident.suspects) == list(SLOTS)


def test_one_lapsed_lease_without_an_outage_is_lost_at_once() -> None:
    h = Harness()
    h.running(first_step_at=h.clock.now - 49)
    h.tick()
    h.clock.advance(6)
    h.lapse("node-1")
    h.tick()
    [incident] = h.incidents()
    assert incident.suspects == ["node-1"]


def test_a_leadership_that_lapsed_with_etcd_is_taken_again_unless_someone_else_took_it() -> None:
    h = Harness()
    controller = h.new_controller()
    leader = controller.leader
    leader.ttl = 0.3  # its keep-alive thread renews every 0.1 s: it notices a lapse at once
    h.store.delete(leader.key)
    assert leader.try_acquire()
    try:

        def lapse() -> None:
            assert leader._lease is not None
            h.store.revoke_lease(leader._lease.id)  # etcd expired it while it was paused
            assert wait_for(leader.lost.is_set, timeout=60)  # the keep-alive thread's renewal failed

        lapse()
        with pytest.raises(LeaseLost):  # no outage seen: the leadership is simply lost
            controller._keep_leading()
        controller.etcd_outage.failed(h.clock.now, StoreUnavailable("timed out"))
        h.clock.advance(10)
        controller.etcd_outage.answered(h.clock.now)
        controller._keep_leading()  # taken again
        assert h.store.get_raw(leader.key) == leader.identity.encode() and not leader.lost.is_set()
        lapse()
        h.store.put(leader.key, "another-controller")
        with pytest.raises(LeaseLost):
            controller._keep_leading()
        h.clock.advance(GRACE + 1)
        h.store.delete(leader.key)
        with pytest.raises(LeaseLost):  # long after etcd's return: not the outage's doing
            controller._keep_leading()
    finally:
        leader.release()
