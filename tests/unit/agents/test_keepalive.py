"""The node's liveness against a real etcd: a stream that broke is replaced at the next renewal, and
a lease revoked by the controller fences the agent (issue 23). That keep-alive messages alone hold
a lease past its TTL, with no writes, is in tests/e2e/store/test_lease_expiry.py (it waits the TTL out)."""

from __future__ import annotations

import uuid

import pytest

from stalwart.agents.lease_keeper import FENCED_EXIT, LeaseKeeper
from stalwart.logs import get_logger
from stalwart.processes import wait_for
from stalwart.store import LeaseLost, Store, keys
from stalwart.store.records import Heartbeat, NodeRegistration

TTL = 2


def test_a_killed_stream_is_opened_again_at_the_next_renewal(store: Store) -> None:
    lease = store.lease(TTL)
    lease.refresh()
    stream = lease._keepalive._stream
    assert stream is not None
    stream.call.cancel()  # what a dropped connection or an etcd restart does to it
    assert wait_for(lambda: not stream.thread.is_alive(), timeout=60)
    lease.refresh()  # no error: the renewal went out again on a new stream
    assert lease.streams_opened == 2
    lease.revoke()


def test_a_revoked_lease_answers_ttl_zero_on_the_open_stream(store: Store) -> None:
    lease = store.lease(TTL)
    lease.refresh()
    store.revoke_lease(lease.id)  # the controller fencing the node
    with pytest.raises(LeaseLost):
        lease.refresh()
    assert lease._keepalive._stream is None  # its stream is closed with it


def _keeper(store: Store, job: str, progress_interval: float | None = None) -> LeaseKeeper:
    node = "node-0"

    def build(now: float) -> Heartbeat:
        return Heartbeat(node=node, generation=1, sent_at=now, workers=[])

    keeper = LeaseKeeper(
        store,
        job,
        node,
        TTL,
        1.0,
        build,
        get_logger("test", job=job, node=node),
        outage_limit=60.0,
        progress_interval=progress_interval,
    )
    keeper.join(
        lambda lease_id: NodeRegistration(node=node, job=job, host="h", agent_pid=1, registered_at=0, lease_id=lease_id)
    )
    return keeper


def test_the_keeper_fences_its_node_when_the_controller_revokes_the_lease(store: Store) -> None:
    job = f"ka-{uuid.uuid4().hex[:6]}"
    keeper = _keeper(store, job)
    keeper.beat()
    assert store.get(keys.node_heartbeat(job, "node-0"), Heartbeat) is not None
    assert keeper.lease is not None
    store.revoke_lease(keeper.lease.id)
    keeper.beat()
    assert keeper.fenced is not None and keeper.fenced.code == FENCED_EXIT
    assert store.get_raw(keys.node_registration(job, "node-0")) is None


def test_the_keeper_renews_every_beat_and_writes_an_unchanged_heartbeat_once_per_progress_interval(
    store: Store,
) -> None:
    job = f"ka-{uuid.uuid4().hex[:6]}"
    keeper = _keeper(store, job, progress_interval=3600.0)  # a huge job: progress waits an hour
    for _ in range(3):
        keeper.beat()
    assert keeper.written == 1  # the first; the next two renewed the lease and wrote nothing
    assert keeper.fenced is None and keeper.lease is not None and keeper.lease.streams_opened == 1
    keeper.stop(revoke=True)
