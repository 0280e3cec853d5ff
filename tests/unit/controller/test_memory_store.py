"""The in-memory store the controller's unit tests use honours the real store's contract: the same
checks run against both, the real one on the session's etcd."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from support.fakes import MemoryStore

from stalwart.store import Store, StoreUnavailable
from stalwart.store.records import JobState


@pytest.fixture(params=["memory", "etcd"])
def any_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
    else:
        yield request.getfixturevalue("store")


def key(name: str) -> str:
    return f"/contract/{name}-{uuid.uuid4().hex[:8]}"


def state(generation: int = 0) -> JobState:
    return JobState(job="j", generation=generation, created_at=0, updated_at=0)


def test_a_missing_key_has_revision_zero_and_commits_against_it_once(any_store: Store) -> None:
    k = key("new")
    assert any_store.get_with_revision(k, JobState) == (None, 0)
    assert any_store.commit({k: state(1)}, expect_revision={k: 0})
    assert not any_store.commit({k: state(2)}, expect_revision={k: 0})
    found, revision = any_store.get_with_revision(k, JobState)
    assert found == state(1) and revision > 0


def test_a_stale_revision_or_a_wrong_guard_value_refuses_the_whole_transaction(any_store: Store) -> None:
    k, guard, other = key("state"), key("leader"), key("incident")
    any_store.put(guard, "me")
    any_store.put(k, state())
    _, revision = any_store.get_with_revision(k, JobState)
    assert not any_store.commit(
        {k: state(5), other: "x"}, expect_value={guard: "someone else"}, expect_revision={k: revision}
    )
    assert not any_store.commit(
        {k: state(5), other: "x"}, expect_value={guard: "me"}, expect_revision={k: revision + 99}
    )
    assert any_store.get_raw(other) is None and any_store.get(k, JobState) == state()
    assert not any_store.commit({other: "x"}, expect_value={key("absent"): "me"})  # a missing guard key fails it
    assert any_store.commit({k: state(5), other: "x"}, expect_value={guard: "me"}, expect_revision={k: revision})
    assert any_store.get_raw(other) == b"x"


def test_a_transaction_moves_every_key_it_writes_to_one_new_revision_and_deletes(any_store: Store) -> None:
    a, b, gone = key("a"), key("b"), key("gone")
    any_store.put(gone, state())
    _, before = any_store.get_with_revision(gone, JobState)
    assert any_store.commit({a: state(1), b: state(2)}, deletes=[gone])
    (_, rev_a), (_, rev_b) = any_store.get_with_revision(a, JobState), any_store.get_with_revision(b, JobState)
    assert rev_a == rev_b > before and any_store.get_raw(gone) is None


def test_keys_under_a_revoked_lease_vanish_and_the_lease_cannot_be_renewed(any_store: Store) -> None:
    from stalwart.store import LeaseLost

    k = key("leased")
    lease = any_store.lease(10)
    any_store.put(k, "alive", lease=lease)
    lease.refresh()
    any_store.revoke_lease(lease.id)
    assert any_store.get_raw(k) is None
    with pytest.raises(LeaseLost):
        lease.refresh()
    with pytest.raises(StoreUnavailable):
        any_store.revoke_lease(lease.id)  # a lease revoked twice: not found


def test_create_and_prefix_reads(any_store: Store) -> None:
    prefix = key("prefix") + "/"
    assert any_store.create(prefix + "b", "2") and not any_store.create(prefix + "b", "3")
    any_store.put(prefix + "a", "1")
    assert any_store.get_prefix_raw(prefix) == [(prefix + "a", b"1"), (prefix + "b", b"2")]
    any_store.delete_prefix(prefix)
    assert any_store.get_prefix_raw(prefix) == []
