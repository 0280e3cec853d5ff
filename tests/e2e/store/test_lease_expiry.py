"""Leases against a real etcd, over real time: a lease renewed by keep-alive messages alone outlives
its TTL, one nobody renews lapses and takes its keys with it, and a controller that dies without
releasing its leadership is replaced once its lease lapses. Each waits out a TTL, so they run with
the end-to-end tests, not in `make test-fast`."""

from __future__ import annotations

import time
import uuid

import pytest

from stalwart.controller.shell.loop import Leadership
from stalwart.processes import wait_for
from stalwart.store import LeaseLost, Store

TTL = 2


def unique(prefix: str) -> str:
    return f"/test/{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_lease_stays_alive_on_one_stream_with_no_writes(store: Store) -> None:
    key = f"/test/alive-{uuid.uuid4().hex[:8]}"
    lease = store.lease(TTL)
    store.put(key, "registered", lease=lease)
    revision = store._client.get(key)[1].mod_revision
    # Past the TTL, renewed only by keep-alive messages: the key stays and nothing was written.
    granted = time.monotonic()
    renewals = 0
    while time.monotonic() - granted < TTL + 0.5:
        lease.refresh()
        renewals += 1
        time.sleep(0.2)
    assert store._client.get(key)[1].mod_revision == revision
    assert renewals > 1 and lease.streams_opened == 1
    lease.revoke()


def test_a_lapsed_lease_removes_its_keys_and_cannot_be_renewed(store: Store) -> None:
    key = unique("leased")
    lease = store.lease(2)
    store.put(key, "alive", lease=lease)
    lease.refresh()
    assert store.get_raw(key) == b"alive"
    assert wait_for(lambda: store.get_raw(key) is None, timeout=60)
    with pytest.raises(LeaseLost):
        lease.refresh()


def test_one_leader_at_a_time_and_takeover_after_its_lease(store: Store) -> None:
    job = f"lead-{uuid.uuid4().hex[:6]}"
    # 5 s leases: a keepalive thread starved for a second or two on a loaded machine keeps the lead.
    first, second = Leadership(store, job, ttl=5), Leadership(store, job, ttl=5)
    assert first.acquire(timeout=5)
    assert not second.acquire(timeout=0.5)
    # A write guarded by leadership lands only for the leader.
    key = unique("guarded")
    assert store.commit({key: "x"}, expect_value=first.guard)
    assert not store.commit({key: "y"}, expect_value=second.guard)
    # The first leader dies without releasing (its renewals stop, nobody revokes): the second takes
    # over after the TTL, and the first learns it lost leadership.
    first._released.set()  # what a SIGKILL does to its keepalive thread
    first._keeper.join()  # type: ignore[union-attr]
    assert second.acquire(timeout=15)
    with pytest.raises(LeaseLost):
        first._lease.refresh()  # type: ignore[union-attr]
    second.release()
