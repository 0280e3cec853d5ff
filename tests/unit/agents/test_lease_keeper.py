"""The agent's lease keeper through an etcd outage (issue 16), beat by beat on a fake clock and an
in-memory etcd that can be made unreachable: it rides the outage out up to the job's limit, takes a
new lease and registers again when its lease lapsed meanwhile, and is fenced only when its lease was
revoked on purpose or the job replaced the node."""

from __future__ import annotations

from support.fakes import FakeClock, MemoryLease, MemoryStore

from stalwart.agents.lease_keeper import ETCD_LOST_EXIT, FENCED_EXIT, LeaseKeeper
from stalwart.logs import get_logger
from stalwart.store import keys
from stalwart.store.client import StoreUnavailable
from stalwart.store.records import Heartbeat, JobState, NodeRegistration, Record

JOB, NODE, TTL, LIMIT = "unit-job", "node-1", 5, 60.0


class AwayLease(MemoryLease):
    def refresh(self) -> None:
        assert isinstance(self._store, EtcdThatGoesAway)
        self._store.answer()
        super().refresh()


class EtcdThatGoesAway(MemoryStore):
    """A MemoryStore whose every call fails while `away`."""

    away = False

    def answer(self) -> None:
        if self.away:
            raise StoreUnavailable("etcd at 127.0.0.1:2379 timed out")

    def get_raw(self, key: str) -> bytes | None:
        self.answer()
        return super().get_raw(key)

    def put(self, key: str, value: Record | str, lease: MemoryLease | None = None) -> None:
        self.answer()
        super().put(key, value, lease)

    def lease(self, ttl: int) -> MemoryLease:
        self.answer()
        inner = super().lease(ttl)
        return AwayLease(self, inner.id)


def keeper(slots: tuple[str, ...] = ("node-0", NODE)) -> tuple[LeaseKeeper, EtcdThatGoesAway, FakeClock]:
    store, clock = EtcdThatGoesAway(), FakeClock()
    store.put(keys.job_state(JOB), JobState(job=JOB, slots=list(slots), created_at=0.0, updated_at=0.0))

    def build(now: float) -> Heartbeat:
        return Heartbeat(node=NODE, generation=1, sent_at=now, workers=[])

    k = LeaseKeeper(
        store,  # type: ignore[arg-type]
        JOB,
        NODE,
        TTL,
        1.0,
        build,
        get_logger("test", job=JOB, node=NODE),
        outage_limit=LIMIT,
        clock=clock.time,
    )
    k.join(
        lambda lease_id: NodeRegistration(node=NODE, job=JOB, host="h", agent_pid=1, registered_at=0, lease_id=lease_id)
    )
    return k, store, clock


def registration(store: MemoryStore) -> NodeRegistration | None:
    return store.get(keys.node_registration(JOB, NODE), NodeRegistration)


def beats(k: LeaseKeeper, clock: FakeClock, seconds: float) -> None:
    """The keeper's loop for `seconds`: a beat every second."""
    for _ in range(int(seconds)):
        clock.advance(1)
        k.beat()


def lapse_in_an_outage(k: LeaseKeeper, store: EtcdThatGoesAway, clock: FakeClock) -> MemoryLease:
    """etcd away for 10 s; back, it expires the lease nobody could renew for longer than its TTL."""
    lease = k.lease
    assert isinstance(lease, MemoryLease)
    store.away = True
    beats(k, clock, 10)
    store.away = False
    store.revoke_lease(lease.id)
    return lease


def test_a_short_outage_is_ridden_out_on_the_same_lease() -> None:
    k, store, clock = keeper()
    first = k.lease
    beats(k, clock, 2)
    store.away = True
    beats(k, clock, 3)
    assert k.etcd_away and k.fenced is None
    store.away = False
    beats(k, clock, 1)
    assert not k.etcd_away and k.fenced is None and k.lease is first and k.rejoined == 0
    beat = store.get(keys.node_heartbeat(JOB, NODE), Heartbeat)
    assert beat is not None and beat.sent_at == clock.now


def test_a_lease_that_lapsed_while_etcd_was_away_is_replaced_and_the_node_registers_again() -> None:
    k, store, clock = keeper()
    old = lapse_in_an_outage(k, store, clock)
    assert registration(store) is None
    beats(k, clock, 1)
    assert k.fenced is None and k.rejoined == 1 and k.lease is not None and k.lease.id != old.id
    reg = registration(store)
    assert reg is not None and reg.lease_id == k.lease.id
    assert store.get(keys.node_heartbeat(JOB, NODE), Heartbeat) is not None
    beats(k, clock, 3)
    assert k.rejoined == 1 and k.fenced is None  # the new lease holds


def test_a_lease_revoked_before_its_ttl_ran_out_fences_the_node() -> None:
    """The controller revokes the lease of a node it replaced: that is no lapse."""
    k, store, clock = keeper()
    beats(k, clock, 2)
    assert k.lease is not None
    store.revoke_lease(k.lease.id)
    beats(k, clock, 1)
    assert k.fenced is not None and k.fenced.code == FENCED_EXIT and "revoked" in str(k.fenced)
    assert registration(store) is None


def test_a_lapsed_lease_of_a_node_the_job_replaced_meanwhile_fences_it() -> None:
    k, store, clock = keeper()
    lapse_in_an_outage(k, store, clock)
    store.put(keys.job_state(JOB), JobState(job=JOB, slots=["node-0", "node-2"], created_at=0.0, updated_at=0.0))
    beats(k, clock, 1)
    assert k.fenced is not None and k.fenced.code == FENCED_EXIT and "replaced" in str(k.fenced)
    assert registration(store) is None  # it did not register again


def test_an_outage_past_the_limit_stops_the_node_with_a_one_line_reason() -> None:
    k, store, clock = keeper()
    store.away = True
    beats(k, clock, LIMIT)
    assert k.fenced is None  # exactly at the limit: still riding it out
    beats(k, clock, 2)
    assert k.fenced is not None and k.fenced.code == ETCD_LOST_EXIT
    reason = str(k.fenced)
    assert "\n" not in reason and reason.startswith("etcd unreachable for 61s")
    assert "faultTolerance.etcdOutageSeconds (60s)" in reason
