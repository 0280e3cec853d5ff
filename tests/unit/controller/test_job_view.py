"""The controller reads its job's nodes by watch (issue 23): a tick costs what changed, not N.

Through real controller ticks on the in-memory fakes (whose watches deliver at once), and once over
a real etcd: a lapsed lease's registration delete is a lost node in the next tick; commands are
written once and never read back; a tick makes the same few reads at 2 and at 200 nodes; the
watch-fed observation is what a full read of the prefix gives; an eviction too big for one etcd
transaction commits its cordons first and the state last.
"""

from __future__ import annotations

from typing import Any

from support.controller_harness import JOB, Harness, worker

from stalwart.controller.core.decision import SendCommand
from stalwart.controller.shell.loop import IDLE_TICK_SECONDS, TICK_SECONDS, commit_chunks, tick_interval
from stalwart.controller.shell.observer import JobView
from stalwart.logs import get_logger
from stalwart.processes import wait_for
from stalwart.spec.model import FailureEvent
from stalwart.store import Store, keys
from stalwart.store.client import MAX_TXN_OPS
from stalwart.store.nodes import read_nodes
from stalwart.store.records import AgentAction, Cordon, Heartbeat, JobStage, NodeRegistration

S = JobStage


class Counting:
    """Counts a store's single-key reads and its writes of command keys during a block."""

    def __init__(self, h: Harness) -> None:
        self.store, self.reads, self.command_writes = h.store, 0, 0

    def __enter__(self) -> Counting:
        store, self._saved = self.store, {}
        for name in ("get", "get_raw", "get_with_revision"):
            inner = getattr(store, name)
            self._saved[name] = inner

            def read(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
                self.reads += 1
                return _inner(*args, **kwargs)

            setattr(store, name, read)
        for name in ("put", "put_batch"):
            inner = getattr(store, name)
            self._saved[name] = inner

            def write(key_or_batch: Any, *args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
                batch = key_or_batch if isinstance(key_or_batch, dict) else {key_or_batch: None}
                self.command_writes += sum(1 for k in batch if k.endswith("/command"))
                return _inner(key_or_batch, *args, **kwargs)

            setattr(store, name, write)
        return self

    def __exit__(self, *exc: object) -> None:
        for name, inner in self._saved.items():
            setattr(self.store, name, inner)


def big_job(nodes: int) -> Harness:
    h = Harness(roles=[{"name": "trainer", "replicas": nodes, "processesPerNode": 2, "command": ["python", "t.py"]}])
    h.running(slots=tuple(f"node-{i}" for i in range(nodes)))
    return h


def test_a_lapsed_lease_is_a_lost_node_in_the_next_tick() -> None:
    h = Harness()
    h.running()
    h.tick()
    h.clock.advance(0.1)
    h.lapse("node-1")  # etcd deletes the registration: the watch tells the view
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class is FailureEvent.LOST_NODE and incident.evicted == ["node-1"]
    assert incident.detected_at == h.clock.now


def test_commands_are_written_once_and_never_read_back() -> None:
    h = Harness()
    h.join("node-0", "node-1")
    for _ in range(10):  # the state, the nodes ready, generation 1: RUN for both
        h.tick()
        if h.command("node-0"):
            break
    assert h.command("node-0") == (1, "run") and h.command("node-1") == (1, "run")
    with Counting(h) as counted:
        h.tick(5)
    assert counted.command_writes == 0 and not [e for e in h.decision.effects if isinstance(e, SendCommand)]
    # Someone else changes a command: the watch tells the view, and the controller writes it back.
    from stalwart.store.records import AgentCommand

    h.store.put(keys.node_command(JOB, "node-0"), AgentCommand(generation=1, action=AgentAction.STOP, issued_at=0))
    with Counting(h) as counted:
        h.tick()
    assert counted.command_writes == 1 and h.command("node-0") == (1, "run")


def test_a_tick_makes_the_same_few_reads_at_2_and_200_nodes() -> None:
    reads = {}
    for nodes in (2, 200):
        h = big_job(nodes)
        h.tick()  # the view's first, whole read of the prefixes
        whole_reads = len(h.store.prefix_reads)
        with Counting(h) as counted:
            h.clock.advance(0.1)
            h.tick()
        reads[nodes] = counted.reads
        assert len(h.store.prefix_reads) == whole_reads  # no prefix read again
        assert h.state().stage is S.RUNNING
    assert reads[2] == reads[200] <= 3  # the state, the spec (and nothing per node)


def test_the_watch_fed_observation_is_a_full_reads() -> None:
    h = Harness()
    h.running()
    h.tick()  # the controller has seen node-1's heartbeat
    h.lapse("node-1")
    h.beat("node-0", 1, [worker(0, step=7), worker(1, step=7)])
    obs = h.controller.observer.observe({}, frozenset())
    full = read_nodes(h.store, JOB)  # type: ignore[arg-type]
    assert obs.registrations == full.registrations and obs.commands == full.commands
    assert obs.beats["node-0"] == full.heartbeats["node-0"]
    assert "node-1" in obs.beats and "node-1" not in full.heartbeats  # its last beat outlives its lease


def test_an_eviction_too_big_for_one_transaction_commits_its_cordons_first_and_the_state_last() -> None:
    h = big_job(200)
    h.tick()
    for i in range(150):  # a rack goes: 150 leases lapse (not every slot's: that would be etcd's outage)
        h.lapse(f"node-{i}")
    commits: list[list[str]] = []
    commit = h.store.commit

    def recorded(puts: dict[str, Any], **kwargs: Any) -> bool:
        commits.append(list(puts))
        return commit(puts, **kwargs)

    h.store.commit = recorded  # type: ignore[method-assign]
    h.tick()
    [incident] = h.incidents()
    assert len(incident.evicted) == 150 and len(h.state().evicted) == 150
    assert len(h.store.get_prefix(keys.cordons_prefix(), Cordon)) == 150
    # 150 cordons, the incident and the state: cordons ahead, then the rest with the state last
    ahead, last = commits[0], commits[1]
    assert all(k.startswith(keys.cordons_prefix()) for k in ahead) and len(ahead) + len(last) == 152
    assert keys.job_state(JOB) in last and len(last) <= MAX_TXN_OPS


def test_commit_chunks_keep_every_transaction_within_etcds_limit() -> None:
    state_key = keys.job_state(JOB)
    puts: dict[str, Any] = {keys.cordon(f"n{i}"): f"c{i}" for i in range(300)} | {state_key: "s", "inc": "i"}
    chunks = commit_chunks(puts, ["gone"])
    assert [len(c) for c in chunks] == [128, 47]
    left = len(puts) - sum(map(len, chunks)) + 1  # and the delete
    assert left == MAX_TXN_OPS and all(state_key not in c and "inc" not in c for c in chunks)
    assert commit_chunks({state_key: "s", keys.cordon("a"): "c"}, []) == []


def test_the_view_over_a_real_etcd_sees_a_lease_lapse(store: Store) -> None:
    job = "view-real"
    store.delete_prefix(keys.job_prefix(job))
    lease = store.lease(5)
    store.put(
        keys.node_registration(job, "node-0"),
        NodeRegistration(node="node-0", job=job, host="h", agent_pid=1, registered_at=0, lease_id=lease.id),
        lease=lease,
    )
    view = JobView(store, job, get_logger("test"))
    try:
        view.refresh()
        assert set(view.registrations) == {"node-0"}
        store.revoke_lease(lease.id)
        assert wait_for(lambda: view.refresh() is not None and not view.registrations, timeout=60)
    finally:
        view.close()
        store.delete_prefix(keys.job_prefix(job))


def test_the_view_notices_what_the_controller_acts_on_and_not_progress(store: Store) -> None:
    """Over a real etcd: a heartbeat that only moved progress or saved is no notice; a worker's exit is one,
    and trouble; a node that joins is one, and one that loses its lease is trouble. Each step ends
    with a write that is a notice, in the same watch, so an absence is checked without waiting."""
    job = "view-notice"
    store.delete_prefix(keys.job_prefix(job))
    notices: list[bool] = []
    view = JobView(store, job, get_logger("test"), notice=notices.append)

    def beat(node: str, **fields: Any) -> None:
        store.put(
            keys.node_heartbeat(job, node),
            Heartbeat(node=node, generation=1, sent_at=0.0, workers=[worker(0, **fields)]),
        )

    def registration(node: str) -> None:
        store.put(
            keys.node_registration(job, node),
            NodeRegistration(node=node, job=job, host="h", agent_pid=1, registered_at=0, lease_id=0),
        )

    def settled(count: int) -> list[bool]:
        assert wait_for(lambda: len(notices) >= count, timeout=60)
        return notices[:]

    try:
        view.refresh()
        beat("node-0", step=5)
        registration("marker-1")
        assert settled(2) == [False, False]  # node-0's first heartbeat, then the marker's join
        beat("node-0", step=6, loss=1.5)  # progress only
        beat("node-0", step=10, last_checkpoint_step=10)  # a save: the timed tick reads it
        registration("marker-2")
        assert settled(3) == [False, False, False]  # the marker's join alone
        beat("node-0", step=6, exit_code=1)
        assert settled(4)[-1] is True  # a worker exited: trouble
        store.delete(keys.node_registration(job, "marker-1"))
        assert settled(5)[-1] is True  # a node lost its registration: trouble
    finally:
        view.close()
        store.delete_prefix(keys.job_prefix(job))


def test_a_quiet_running_job_is_ticked_at_the_idle_pace_and_everything_else_at_the_tick() -> None:
    assert tick_interval(S.RUNNING, alert=False) == IDLE_TICK_SECONDS
    assert tick_interval(S.SUSPENDED, alert=False) == IDLE_TICK_SECONDS
    assert tick_interval(S.RUNNING, alert=True) == TICK_SECONDS  # trouble is unfolding
    for stage in (S.STARTING, S.PREFLIGHT, S.RESTARTING, S.CHECKING, S.SUSPENDING):
        assert tick_interval(stage, alert=False) == TICK_SECONDS
    assert tick_interval(None, alert=False) == TICK_SECONDS  # no state yet
