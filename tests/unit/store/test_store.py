"""The etcd store against a real etcd server: records, leases, watches, races. What waits out a
lease's TTL (expiry, a leader's takeover) is in tests/e2e/store/test_lease_expiry.py."""

from __future__ import annotations

import threading
import uuid

import pytest

from stalwart.processes import wait_for
from stalwart.store import Store, StoreUnavailable
from stalwart.store.records import AgentAction, AgentCommand, JobPhase, JobState


def unique(prefix: str) -> str:
    return f"/test/{prefix}-{uuid.uuid4().hex[:8]}"


def test_typed_records_round_trip(store: Store) -> None:
    key = unique("state")
    state = JobState(job="j", phase=JobPhase.RUNNING, generation=3, created_at=1.0, updated_at=2.0)
    store.put(key, state)
    assert store.get(key, JobState) == state
    assert store.get(key + "-missing", JobState) is None


def test_only_one_of_two_racing_creators_wins(store: Store) -> None:
    key = unique("race")
    results: list[bool] = []
    barrier = threading.Barrier(8)

    def creator(i: int) -> None:
        barrier.wait()
        results.append(store.create(key, f"writer-{i}"))

    threads = [threading.Thread(target=creator, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1


def test_commit_refuses_a_stale_writer(store: Store) -> None:
    key = unique("cas")
    store.put(key, JobState(job="j", created_at=0, updated_at=0))
    _, rev = store.get_with_revision(key, JobState)
    first = JobState(job="j", generation=1, created_at=0, updated_at=0)
    second = JobState(job="j", generation=99, created_at=0, updated_at=0)
    assert store.commit({key: first}, expect_revision={key: rev})
    assert not store.commit({key: second}, expect_revision={key: rev})  # read before the first commit
    assert store.get(key, JobState).generation == 1  # type: ignore[union-attr]


def test_watch_delivers_puts_and_deletes(store: Store) -> None:
    prefix = unique("watch") + "/"
    seen: list[tuple[str, bytes | None]] = []
    store.watch_prefix(prefix, lambda k, v: seen.append((k, v)))
    cmd = AgentCommand(generation=2, action=AgentAction.RUN, issued_at=1.0)
    store.put(prefix + "a", cmd)
    store.delete(prefix + "a")
    assert wait_for(lambda: len(seen) >= 2, timeout=60)
    assert AgentCommand.loads(seen[0][1]) == cmd  # type: ignore[arg-type]
    assert seen[1] == (prefix + "a", None)


def test_unreachable_etcd_is_a_clear_error() -> None:
    from stalwart.net import free_port

    s = Store(f"127.0.0.1:{free_port()}", timeout=1.0)
    with pytest.raises(StoreUnavailable, match="127.0.0.1"):
        s.get_raw("/x")
    s.close()


def test_bad_endpoint() -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        Store("localhost")
