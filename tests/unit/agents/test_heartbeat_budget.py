"""The heartbeat write rule (issue 23): a change the controller acts on is written at once; unchanged
progress waits for the progress interval, which is the heartbeat interval for small jobs and grows
with the job so that the whole job stays under the write budget."""

from __future__ import annotations

import pytest
from support.fakes import FakeClock, MemoryStore

from stalwart.agents.lease_keeper import LeaseKeeper
from stalwart.logs import get_logger
from stalwart.spec import parse_job
from stalwart.store import keys
from stalwart.store.heartbeat_budget import (
    HEARTBEAT_PUTS_PER_SECOND,
    HeartbeatGate,
    job_progress_interval,
    progress_interval,
    progress_phase,
    significant,
    trouble,
    urgent,
)
from stalwart.store.records import Heartbeat, LogMatch, NodeRegistration, SavedCheckpoint, WorkerState, WorkerStatus

T0 = 1_000_000.0


def beat(now: float, step: int | None = 10, **worker: object) -> Heartbeat:
    status = WorkerStatus(local_rank=0, rank=0, pid=4242, state=WorkerState.RUNNING, started_at=T0, first_step=1)
    status = status.model_copy(update={"step": step, "loss": 2.0, "last_progress_at": now, **worker})
    return Heartbeat(node="node-0", generation=1, sent_at=now, workers=[status], vector={"at": now})


def test_the_interval_is_the_heartbeats_for_small_jobs_and_grows_with_big_ones() -> None:
    assert progress_interval(1.0, 10) == 1.0
    assert progress_interval(1.0, 500) == 1.0
    assert progress_interval(1.0, 10_000) == 10_000 / HEARTBEAT_PUTS_PER_SECOND == 20.0
    assert progress_interval(30.0, 10_000) == 30.0  # a slow heartbeat is already under the budget
    # Whatever the size, the job's progress writes stay within the budget.
    for nodes in (10, 1_000, 3_000, 10_000, 100_000):
        assert nodes / progress_interval(1.0, nodes) <= HEARTBEAT_PUTS_PER_SECOND


def job(replicas: int) -> dict[str, object]:
    role = {"name": "trainer", "replicas": replicas, "processesPerNode": 8, "command": ["python", "t.py"]}
    return {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "j"},
        "spec": {"roles": [role]},
    }


def test_both_sides_compute_it_from_the_spec() -> None:
    assert job_progress_interval(parse_job(job(10), "test").spec) == 1.0
    assert job_progress_interval(parse_job(job(10_000), "test").spec) == 20.0


@pytest.mark.parametrize(
    "change",
    [
        {"state": WorkerState.EXITED, "exit_code": 1, "failure_class": "segfault"},
        {"pid": 4343},
        {"first_step": 11},
        {
            "matches": [
                LogMatch(
                    failure_class="nccl_timeout", scope="job", severity="error", line="x", line_number=1, matched_at=T0
                )
            ]
        },
    ],
    ids=["exit", "restart", "first-step", "log-match"],
)
def test_a_change_the_controller_acts_on_is_written_at_once(change: dict[str, object]) -> None:
    gate = HeartbeatGate(1.0, 20.0)
    gate.wrote(beat(T0), T0)
    assert not gate.due(beat(T0 + 1, step=11), T0 + 1)  # progress alone waits
    assert gate.due(beat(T0 + 1, step=11, **change), T0 + 1)


def match(at: float) -> LogMatch:
    return LogMatch(failure_class="peer_closed", scope="job", severity="error", line="x", line_number=1, matched_at=at)


def test_trouble_is_urgent_and_urgent_is_significant_but_saves_and_progress_wake_nobody() -> None:
    """What the agent writes at once (`significant`) includes what wakes the controller (`urgent`),
    which includes what makes it watch closely (`trouble`)."""
    base = beat(T0)
    kept = [match(T0 + i) for i in range(20)]  # a worker keeps its newest matches, a bounded list
    cases = {
        "exit": (beat(T0, state=WorkerState.EXITED, exit_code=1), True, True),
        "another match at the cap": (beat(T0, matches=[*kept[1:], match(T0 + 99)]), True, True),
        "restart": (beat(T0, pid=4343), False, True),
        "first step": (beat(T0, first_step=11), False, True),
        "a save": (beat(T0, last_checkpoint_step=10), False, False),
        "progress": (beat(T0 + 5, step=99, loss=0.5), False, False),
    }
    at_cap = beat(T0, matches=kept)
    for name, (changed, is_trouble, is_urgent) in cases.items():
        before = at_cap if name == "another match at the cap" else base
        assert (trouble(changed) != trouble(before)) is is_trouble, name
        assert (urgent(changed) != urgent(before)) is is_urgent, name
        assert (significant(changed) != significant(before)) is (is_urgent or name == "a save"), name


def test_node_level_changes_are_written_at_once() -> None:
    gate = HeartbeatGate(1.0, 20.0)
    gate.wrote(beat(T0), T0)
    for changed in (
        beat(T0 + 1).model_copy(update={"generation": 2}),
        beat(T0 + 1).model_copy(update={"agent_state": "stopping"}),
        beat(T0 + 1).model_copy(update={"machine_faults": ["xid 79"]}),
    ):
        assert gate.due(changed, T0 + 1)


def saved(now: float) -> Heartbeat:
    return beat(now, last_checkpoint_step=10).model_copy(
        update={"checkpoints": [SavedCheckpoint(step=10, committed_at=now)]}
    )


def test_a_save_goes_at_once_in_a_small_job_and_with_the_progress_in_a_big_one() -> None:
    """Every node saves at the same step: in a big job they would all write at that moment."""
    small, big = HeartbeatGate(1.0, 1.0), HeartbeatGate(1.0, 20.0)
    for gate in (small, big):
        gate.wrote(beat(T0), T0)
    assert small.saves_at_once and small.due(saved(T0 + 0.1), T0 + 0.1)
    assert not big.saves_at_once and not any(big.due(saved(T0 + s), T0 + s) for s in range(1, 19))
    assert big.due(saved(T0 + 20), T0 + 20)  # at the node's phase (0 here), with its progress
    # A save then a restart: the restart goes at once, and the save with it.
    assert big.due(saved(T0 + 5).model_copy(update={"generation": 2}), T0 + 5)


def test_unchanged_progress_waits_for_the_progress_interval() -> None:
    gate = HeartbeatGate(1.0, 20.0)
    gate.wrote(beat(T0), T0)
    assert not any(gate.due(beat(T0 + s, step=10 + s), T0 + s) for s in range(1, 19))
    assert gate.due(beat(T0 + 20, step=30), T0 + 20)
    assert gate.due(beat(T0 + 19.6, step=30), T0 + 19.6)  # a timed beat a hair early still writes


def progress_writes(gate: HeartbeatGate, start: float, seconds: int, saves_at: set[int] = frozenset()) -> list[float]:
    """The times a node beating every second writes, its last save changing at `saves_at`."""
    written = []
    for s in range(seconds):
        now = start + s
        if gate.due(beat(now, last_checkpoint_step=sum(1 for t in saves_at if t <= s)), now):
            gate.wrote(beat(now, last_checkpoint_step=sum(1 for t in saves_at if t <= s)), now)
            written.append(now)
    return written


def test_a_big_jobs_nodes_write_their_progress_at_their_own_phase_even_after_a_common_save() -> None:
    """Every node writes at once when a checkpoint lands; their progress writes then stay spread over
    the interval (a steady write rate, and a stall seen within a beat or two, not an interval late)."""
    nodes = [f"node-{i}" for i in range(200)]
    phases = [progress_phase(n, 20.0) for n in nodes]
    assert all(0 <= p < 20.0 for p in phases) and progress_phase("node-7", 20.0) == phases[7]  # stable
    gates = [HeartbeatGate(1.0, 20.0, p) for p in phases]
    writes = [progress_writes(g, T0, 120, saves_at={30, 70}) for g in gates]
    for w in writes:
        gaps = [b - a for a, b in zip(w, w[1:], strict=False)]
        assert max(gaps) <= 20.0 + 0.5  # never longer than the interval (and its half-beat slack)
        assert len(w) <= 120 / 20 + 2 + 2  # the interval's writes and each save's, at most
    # After the second common save, the writes of the next interval spread over its seconds.
    later = [t - T0 for w in writes for t in w if T0 + 71 <= t < T0 + 91]
    per_second = [sum(1 for t in later if int(t) == s) for s in range(71, 91)]
    assert len(later) == len(nodes)  # each node once
    assert max(per_second) < len(nodes) / 4  # no burst: the common save did not line them up


def test_a_small_job_writes_every_beat_as_before() -> None:
    gate = HeartbeatGate(1.0, 1.0)
    gate.wrote(beat(T0), T0)
    assert gate.due(beat(T0 + 1), T0 + 1)  # the same record, a heartbeat interval later
    assert gate.due(beat(T0 + 0.98), T0 + 0.98)  # a timer that fired early
    assert not gate.due(beat(T0 + 0.05), T0 + 0.05)  # an early beat with nothing new


def test_the_lease_keeper_puts_by_the_rule_and_renews_every_beat() -> None:
    store, clock = MemoryStore(), FakeClock()
    records = {"step": 0, "exited": False}

    def build(now: float) -> Heartbeat:
        change = {"state": WorkerState.EXITED, "exit_code": 1} if records["exited"] else {}
        return beat(now, step=records["step"], **change)

    keeper = LeaseKeeper(
        store,  # type: ignore[arg-type]
        "j",
        "node-0",
        5,
        1.0,
        build,
        get_logger("test", job="j", node="node-0"),
        outage_limit=60.0,
        progress_interval=5.0,
        clock=clock.time,
    )
    keeper.join(
        lambda lease_id: NodeRegistration(
            node="node-0", job="j", host="h", agent_pid=1, registered_at=0, lease_id=lease_id
        )
    )
    for _ in range(10):
        clock.advance(1)
        records["step"] += 1
        keeper.beat()
    # the first beat, then one at each of node-0's phase points of the progress interval
    phase = progress_phase("node-0", 5.0)
    assert keeper.written == 1 + sum(1 for k in range(-1, 4) if 1.5 < phase + 5 * k <= 10.5)
    before = keeper.written
    records["exited"] = True
    clock.advance(0.1)
    keeper.beat()
    assert keeper.written == before + 1  # at once
    written = store.get(keys.node_heartbeat("j", "node-0"), Heartbeat)
    assert written is not None and written.workers[0].state is WorkerState.EXITED
