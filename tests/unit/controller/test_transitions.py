"""Every row of the transition table, taken by a real JobController tick on the in-memory fakes.

Each scenario starts from a state written straight into the store, ticks, and checks that exactly
its row was taken and what was committed with it. `test_every_row_has_a_scenario` keeps the list
complete: a new row without a scenario fails it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.controller_harness import JOB, Harness, worker

from stalwart.controller.core.transitions import ACTIVE, TABLE, WAITING_FOR_NODES, Row, Trigger
from stalwart.spec.model import FailureEvent
from stalwart.store import keys
from stalwart.store.records import (
    CheckpointEntry,
    CheckpointRequest,
    Incident,
    JobStage,
    ReplayGroupRun,
    ReplayState,
    RequestKind,
    SavedCheckpoint,
)

S = JobStage
Scenario = Callable[[], Harness]


# -- Pending -------------------------------------------------------------------------------------
def created() -> Harness:
    h = Harness()
    h.tick()
    assert h.state().slots == ["node-0", "node-1"] and h.state().stage is S.STARTING
    return h


def starting_to_preflight() -> Harness:
    h = Harness(faultTolerance={"preflight": True})
    h.put_state(stage=S.STARTING)
    h.join("node-0", "node-1")
    h.tick()
    assert [w.key for w in h.runner.launched] == [("checks", "preflight", "1")]
    return h


def starting_to_running() -> Harness:
    h = Harness()
    h.put_state(stage=S.STARTING)
    h.join("node-0", "node-1")
    h.tick()
    assignment = h.assignment(1)
    assert assignment is not None and assignment.rank_nodes() == {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}
    assert h.command("node-0") == (1, "run") and h.command("node-1") == (1, "run")
    return h


def starting_never_ready() -> Harness:
    h = Harness()
    h.put_state(stage=S.STARTING, stage_since=h.clock.now - 301)
    h.join("node-0")
    h.tick()
    assert h.state().reason == "NodesNotReady" and "node-1" in (h.state().message or "")
    return h


def preflight_passed() -> Harness:
    h = Harness(faultTolerance={"preflight": True})
    h.put_state(stage=S.PREFLIGHT)
    h.join("node-0", "node-1")
    h.tick()  # launches the checks (again: a controller that restarted mid-check)
    h.runner.finish_checks(h.cluster)
    h.tick()
    assert h.state().generation == 1 and h.state().preflight_rounds == 1 and h.incidents() == []
    return h


def preflight_retry() -> Harness:
    h = Harness(faultTolerance={"preflight": True})
    h.cluster.failing["node-1"] = ["compute check: wrong bits"]
    h.put_state(stage=S.PREFLIGHT)
    h.join("node-0", "node-1")
    h.tick()
    h.runner.finish_checks(h.cluster)
    h.tick()
    state = h.state()
    assert state.slots == ["node-0", "node-2"] and state.evicted == ["node-1"] and state.restarts == 0
    [incident] = h.incidents()
    assert incident.failure_class.value == "PreflightFailed" and not incident.counted
    assert incident.evidence == ["compute check: wrong bits"]
    return h


def preflight_exhausted() -> Harness:
    h = Harness(faultTolerance={"preflight": True})
    h.cluster.failing["node-1"] = ["collective timed out"]
    h.put_state(stage=S.PREFLIGHT, preflight_rounds=2)
    h.join("node-0", "node-1")
    h.tick()
    h.runner.finish_checks(h.cluster)
    h.tick()
    assert h.state().reason == "PreflightFailed"
    return h


# -- Running -------------------------------------------------------------------------------------
def succeeded() -> Harness:
    h = Harness()
    h.running()
    for i, node in enumerate(["node-0", "node-1"]):
        h.beat(node, 1, [worker(r, step=60, exit_code=0, loss=1.5) for r in (2 * i, 2 * i + 1)])
    h.tick()
    state = h.state()
    assert state.reason == "Completed" and state.last_step == 60 and state.last_loss == 1.5
    return h


def failure_handled() -> Harness:
    """A lost node, hot-swapped: the standby takes its slot, the incident is committed with it."""
    h = Harness(standbys={"count": 1})
    h.running(standbys=["node-2"], next_node_index=3, standbys_checked=["node-2"])
    h.join("node-2")
    h.clock.advance(1)
    h.lapse("node-1")
    h.tick()
    state = h.state()
    assert state.slots == ["node-0", "node-2"] and state.standbys == ["node-3"] and state.evicted == ["node-1"]
    assert state.restarts == 0 and state.infra_restarts == 1
    [incident] = h.incidents()
    assert incident.failure_class.value == "LostNode" and incident.replacements == {"node-1": "node-2"}
    assert state.open_incident == incident.id
    return h


def failure_checked() -> Harness:
    """A worker killed with no message: restart, after stop-time checks."""
    h = Harness()
    h.running()
    h.clock.advance(1)
    h.beat("node-0", 1, [worker(0, at=h.clock.now), worker(1, exit_code=-9, exited_at=h.clock.now - 0.5)])
    h.beat("node-1", 1, [worker(2, at=h.clock.now), worker(3, at=h.clock.now)])
    h.tick()  # the crash waits for diagnosis to read its logs (off the loop)
    assert h.state().stage is S.RUNNING
    [crash] = [w for w in h.runner.launched if w.key[0] == "crash"]
    h.runner.finish(crash.key, diagnosis=None)
    h.tick()
    state = h.state()
    assert state.restarts == 1
    [incident] = h.incidents()
    assert incident.failure_class.value == "WorkerCrash" and incident.rank == 1 and incident.node == "node-0"
    assert "run stop-time checks" in incident.action
    return h


def failure_fatal() -> Harness:
    h = Harness(failurePolicy={"maxRestarts": 0})
    h.running()
    died = h.clock.now - 1
    h.beat("node-0", 1, [worker(0), worker(1, exit_code=-9, exited_at=died)])
    h.tick()  # diagnosis is asked to read the logs; it does not answer within CRASH_DIAGNOSIS_WAIT
    h.clock.advance(6)
    h.beat("node-0", 1, [worker(0, at=h.clock.now), worker(1, exit_code=-9, exited_at=died)])
    h.beat("node-1", 1, [worker(2, at=h.clock.now), worker(3, at=h.clock.now)])
    h.tick()
    assert h.state().reason == "RestartBudgetExhausted"
    [incident] = h.incidents()
    assert incident.policy_action is not None and incident.policy_action.value == "Fail"
    return h


def evict_requested() -> Harness:
    h = Harness(standbys={"count": 1})
    h.running(standbys=["node-2"], next_node_index=3)
    h.join("node-2")
    h.request(RequestKind.EVICT, "node-1")
    h.tick()
    assert h.state().slots == ["node-0", "node-2"] and h.state().infra_restarts == 1
    request = h.request_record()
    assert request.status.value == "Done" and request.result == {
        "incident": h.incidents()[0].id,
        "replacements": {"node-1": "node-2"},
    }
    return h


# -- Restarting ----------------------------------------------------------------------------------
def restarted() -> Harness:
    h = Harness()
    h.put_state(stage=S.RESTARTING, generation=1, restarts=1)
    h.join("node-0", "node-1", generation=1)
    h.tick()
    assert h.state().generation == 2 and h.command("node-1") == (2, "run") and h.state().restarts == 1
    return h


def restarting_never_ready() -> Harness:
    h = Harness(faultTolerance={"restartTimeoutSeconds": 30})
    h.put_state(stage=S.RESTARTING, generation=1, restarts=1, stage_since=h.clock.now - 31)
    h.join("node-0", generation=1)
    h.tick()
    assert h.state().reason == "CapacityUnavailable" and "node-1" in (h.state().message or "")
    return h


# -- elastic data parallelism (minReplicas) -----------------------------------------------------
ELASTIC_ROLES = [
    {"name": "trainer", "replicas": 3, "minReplicas": 2, "processesPerNode": 2, "command": ["python", "train.py"]}
]


def elastic_state(h: Harness, slots: list[str], **fields: object) -> None:
    """The job's state with the trainer on `slots` (its generation's assignment at that size)."""
    from stalwart.controller.core.elastic import relayout, sized
    from stalwart.controller.core.ranks import assign, role_states
    from stalwart.store.jobs import read_spec
    from stalwart.store.records import JobState

    job = read_spec(h.store, JOB)
    assert job is not None
    roles = role_states(job.spec)
    roles["trainer"].nodes = len(slots)
    base = {"job": JOB, "created_at": h.clock.now - 100, "updated_at": h.clock.now - 100}
    state = JobState(**{**base, "slots": slots, "roles": roles, "stage_since": h.clock.now - 1, **fields})
    relayout(state, job.spec)
    h.store.put(keys.job_state(JOB), state)
    spec = sized(job, state).spec
    h.store.put(
        keys.generation(JOB, state.generation),
        assign(JOB, spec, slots, state.generation, ("127.0.0.1", 1), created_at=h.clock.now),
    )


def shrunk() -> Harness:
    h = Harness(roles=ELASTIC_ROLES)
    incident = Incident(
        id="inc-lost",
        job=JOB,
        failure_class=FailureEvent.LOST_NODE,
        generation=1,
        failed_at=h.clock.now - 10,
        detected_at=h.clock.now - 5,
    )
    h.store.put(keys.incident(JOB, incident.id), incident)
    elastic_state(
        h,
        ["node-0", "node-3", "node-2"],
        stage=S.RESTARTING,
        generation=1,
        next_node_index=4,
        open_incident=incident.id,
    )
    h.join("node-0", "node-2", generation=1)  # node-3, node-1's replacement, was never started
    h.cluster.free = 0
    h.tick()
    state = h.state()
    assert state.slots == ["node-0", "node-2"] and state.roles["trainer"].nodes == 2
    [stored] = h.incidents()
    assert stored.resize is not None and (stored.resize.from_replicas, stored.resize.to_replicas) == (3, 2)
    return h


def test_a_shrunk_job_starts_its_next_generation_on_the_nodes_it_kept() -> None:
    h = shrunk()
    h.tick()
    assignment = h.assignment(2)
    assert assignment is not None and assignment.world_size == 4 and h.state().stage is S.RUNNING
    assert h.command("node-0") == (2, "run") and h.command("node-3") is None


def grown() -> Harness:
    from stalwart.store.records import SavedCheckpoint

    h = Harness(roles=ELASTIC_ROLES)
    elastic_state(
        h,
        ["node-0", "node-2"],
        stage=S.RUNNING,
        generation=2,
        generation_started_at=h.clock.now - 50,
        next_node_index=4,
        standbys=["node-3"],
        standby_roles={"node-3": "trainer"},
    )
    h.join("node-0", "node-2", generation=2)
    h.run_generation(2, ["node-0", "node-2"])
    h.join("node-3")  # its machine came back: it registered as the trainer's standby
    saved = SavedCheckpoint(step=10, committed_at=h.clock.now)
    h.beat("node-0", 2, [worker(0, at=h.clock.now), worker(1, at=h.clock.now)], checkpoints=[saved])
    h.tick()
    state = h.state()
    assert state.slots == ["node-0", "node-2", "node-3"] and state.roles["trainer"].world_size == 6
    assert [i.failure_class for i in h.incidents()] == [FailureEvent.ELASTIC_GROW]
    return h


def checks_done() -> Harness:
    h = Harness()
    h.put_state(stage=S.CHECKING, generation=1)
    h.join("node-0", "node-1", generation=1)
    h.beat("node-0", 1, [worker(0), worker(1, exit_code=-9)])  # one worker still running
    h.tick()
    assert h.runner.launched == [] and h.command("node-0") == (1, "stop")  # the checks wait for the machines
    h.beat("node-0", 1, [worker(0, exit_code=-15), worker(1, exit_code=-9)])
    h.tick()
    assert [w.key for w in h.runner.launched] == [("checks", "stop-time", "1")]
    h.runner.finish_checks(h.cluster)
    h.tick()
    assert h.state().unexplained_failures == 1 and h.state().replay is None
    return h


def _checks_passed_with_replay_after_one(h: Harness) -> None:
    h.put_state(stage=S.CHECKING, generation=1, generation_started_at=h.clock.now - 10)
    h.join("node-0", "node-1", generation=1)
    h.tick()
    h.runner.finish_checks(h.cluster)
    h.tick()


def replay_horizontal_due(monkeypatch: pytest.MonkeyPatch) -> Harness:
    """A plan with horizontal groups to run (what a pipeline layout gives)."""
    from stalwart.controller.core import checks

    def two_by_one(spec: object, slots: list[str], role: str | None = None) -> ReplayState:
        return ReplayState(
            horizontal=[ReplayGroupRun(id="h0", nodes=slots)],
            vertical=[ReplayGroupRun(id=f"v{i}", nodes=[n]) for i, n in enumerate(slots)],
        )

    monkeypatch.setattr(checks, "plan_phases", two_by_one)
    h = Harness(failurePolicy={"replayAfter": 1})
    _checks_passed_with_replay_after_one(h)
    return h


def replay_vertical_due() -> Harness:
    h = Harness(failurePolicy={"replayAfter": 1})
    _checks_passed_with_replay_after_one(h)
    replay = h.state().replay
    assert replay is not None and [g.nodes for g in replay.vertical] == [["node-0"], ["node-1"]]
    return h


def _replay(stage: JobStage, outcomes: dict[str, str]) -> Harness:
    """A replay phase launched as generation 3: each node's workers end as `outcomes` says."""
    h = Harness(failurePolicy={"replayAfter": 1})
    horizontal = [ReplayGroupRun(id="h0", nodes=["node-0", "node-1"])]
    if stage is S.REPLAY_VERTICAL:
        horizontal[0].outcome, horizontal[0].reason = "failed", "the whole job"
    replay = ReplayState(
        horizontal=horizontal,
        vertical=[ReplayGroupRun(id="v0", nodes=["node-0"]), ReplayGroupRun(id="v1", nodes=["node-1"])],
        generation=3,
        started_at=h.clock.now,
    )
    incident = Incident(
        id="inc-1", job=JOB, failure_class=FailureEvent.WORKER_CRASH, generation=2, failed_at=0, detected_at=0
    )
    h.store.put(keys.incident(incident.job, incident.id), incident)
    h.put_state(stage=stage, generation=3, replay=replay, standbys=["node-2"], next_node_index=3, open_incident="inc-1")
    h.join("node-0", "node-1", "node-2", generation=3)
    h.tick()
    assert h.state().stage is stage  # nothing judged yet
    for node, outcome in outcomes.items():
        code = 0 if outcome == "passed" else 134
        base = 0 if node == "node-0" else 2
        local = 0 if stage is S.REPLAY_VERTICAL else base
        h.beat(node, 3, [worker(local + i, exit_code=code) for i in range(2)])
    h.tick()
    return h


def horizontal_judged() -> Harness:
    h = _replay(S.REPLAY_HORIZONTAL, {"node-0": "failed", "node-1": "passed"})
    replay = h.state().replay
    assert replay is not None and replay.generation is None and replay.horizontal[0].outcome == "failed"
    return h


def replay_concluded() -> Harness:
    h = _replay(S.REPLAY_VERTICAL, {"node-0": "passed", "node-1": "failed"})
    state = h.state()
    assert state.evicted == ["node-1"] and state.slots == ["node-0", "node-2"] and state.replay is None
    [incident] = h.incidents()
    assert "dual-phase replay found node-1" in incident.action and incident.evicted == ["node-1"]
    assert "v1 ['node-1']: failed, rank 0 on node-1 exited with code 134 at step 5" in incident.evidence
    return h


# -- Suspended -----------------------------------------------------------------------------------
def suspend_from(stage: JobStage) -> Scenario:
    def scenario() -> Harness:
        h = Harness(suspend=True, checkpoint={"saveBeforeSuspendSeconds": 0})  # (checkpoint first: its own row)
        if stage is S.RUNNING:
            h.running()
        else:
            h.put_state(stage=stage, generation=1 if stage is not S.STARTING else 0)
            h.join("node-0", "node-1")
        h.tick()
        state = h.state()
        assert state.suspensions[-1].ended_at is None and h.incidents() == [] and state.restarts == 0
        if stage is not S.STARTING:
            assert h.command("node-0") == (state.generation, "stop")
        assert sorted(h.cluster.called("stop")) == ["node-0", "node-1"]
        return h

    return scenario


def suspend_saving() -> Harness:
    h = Harness(suspend=True)
    h.running()
    h.tick()
    request = h.store.get(keys.checkpoint_request(JOB), CheckpointRequest)
    assert request is not None and request.generation == 1 and request.step > 5
    assert h.state().suspensions[-1].save_step == request.step
    assert h.command("node-0") == (1, "run") and h.cluster.called("stop") == []  # the workers run on to save
    return h


def _saving(h: Harness) -> CheckpointRequest:
    from stalwart.store.records import Suspension

    h.put_state(stage=S.SAVING, generation=1, suspensions=[Suspension(started_at=h.clock.now - 1, save_step=25)])
    h.join("node-0", "node-1", generation=1)
    h.run_generation(1, ["node-0", "node-1"])
    request = CheckpointRequest(id="suspend-1", generation=1, step=25, reason="suspend", requested_at=h.clock.now)
    h.store.put(keys.checkpoint_request(JOB), request)
    return request


def save_committed() -> Harness:
    h = Harness(suspend=True)
    _saving(h)
    saved = SavedCheckpoint(step=25, generation=1, committed_at=h.clock.now)
    h.beat("node-0", 1, [worker(0, at=h.clock.now), worker(1, at=h.clock.now)], checkpoints=[saved])
    h.tick()
    assert h.state().suspensions[-1].saved_step == 25
    assert h.store.get(keys.checkpoint_request(JOB), CheckpointRequest) is None
    assert h.store.get(keys.checkpoint_entry(JOB, 25), CheckpointEntry) is not None
    assert h.command("node-0") == (1, "stop") and sorted(h.cluster.called("stop")) == ["node-0", "node-1"]
    return h


def save_grace_passed() -> Harness:
    h = Harness(suspend=True, checkpoint={"saveBeforeSuspendSeconds": 10})
    _saving(h)
    h.clock.now += 11
    h.tick()
    assert h.state().suspensions[-1].saved_step is None and h.incidents() == []
    assert h.store.get(keys.checkpoint_request(JOB), CheckpointRequest) is None
    assert h.command("node-0") == (1, "stop")
    return h


def resumed_while_saving() -> Harness:
    h = Harness()
    _saving(h)
    h.tick()
    assert h.state().generation == 1 and h.command("node-0") == (1, "run")
    assert h.store.get(keys.checkpoint_request(JOB), CheckpointRequest) is None
    return h


def suspended() -> Harness:
    h = Harness(suspend=True)
    h.put_state(stage=S.SUSPENDING, generation=1)
    h.tick()  # no node left (the cluster knows none)
    return h


def resumed_while_suspending() -> Harness:
    h = Harness()
    h.put_state(stage=S.SUSPENDING, generation=1)
    h.cluster.start_node("node-0")
    h.tick()
    return h


def resumed() -> Harness:
    from stalwart.store.records import Suspension

    h = Harness()
    h.put_state(stage=S.SUSPENDED, generation=4, suspensions=[Suspension(started_at=h.clock.now - 60)])
    h.tick()
    state = h.state()
    assert state.suspensions[-1].ended_at == h.clock.now and state.generation == 4
    return h


def nodes_keep_dying_in(stage: JobStage) -> Scenario:
    def scenario() -> Harness:
        from stalwart.cluster.base import NodeInfo

        h = Harness()
        h.put_state(stage=stage, died_before_joining=6)  # 3 per slot of the 2 already replaced
        h.join("node-0")
        h.cluster.nodes["node-1"] = NodeInfo(name="node-1", alive=False)
        h.tick()
        state = h.state()
        assert state.reason == "NodesDiedBeforeJoining" and state.died_before_joining == 7
        assert "7 slot nodes died before they joined (the last: node-1)" in (state.message or "")
        assert state.slots == ["node-0", "node-1"]  # no node started for a start that cannot succeed
        return h

    return scenario


SCENARIOS: dict[tuple[JobStage | None, Trigger], Callable[..., Harness]] = {
    (None, Trigger.CREATED): created,
    (S.STARTING, Trigger.NODES_READY): starting_to_preflight,
    (S.STARTING, Trigger.GENERATION_STARTED): starting_to_running,
    (S.STARTING, Trigger.NODES_NEVER_READY): starting_never_ready,
    **{(stage, Trigger.NODES_KEEP_DYING): nodes_keep_dying_in(stage) for stage in WAITING_FOR_NODES},
    (S.PREFLIGHT, Trigger.GENERATION_STARTED): preflight_passed,
    (S.PREFLIGHT, Trigger.PREFLIGHT_RETRY): preflight_retry,
    (S.PREFLIGHT, Trigger.PREFLIGHT_EXHAUSTED): preflight_exhausted,
    (S.RUNNING, Trigger.WORKERS_SUCCEEDED): succeeded,
    (S.RUNNING, Trigger.FAILURE_HANDLED): failure_handled,
    (S.RUNNING, Trigger.FAILURE_CHECKED): failure_checked,
    (S.RUNNING, Trigger.FAILURE_FATAL): failure_fatal,
    (S.RUNNING, Trigger.EVICT_REQUESTED): evict_requested,
    (S.RESTARTING, Trigger.GENERATION_STARTED): restarted,
    (S.RESTARTING, Trigger.NODES_NEVER_READY): restarting_never_ready,
    (S.RESTARTING, Trigger.SHRUNK): shrunk,
    (S.RUNNING, Trigger.GROW): grown,
    (S.CHECKING, Trigger.CHECKS_DONE): checks_done,
    (S.CHECKING, Trigger.REPLAY_HORIZONTAL_DUE): replay_horizontal_due,
    (S.CHECKING, Trigger.REPLAY_VERTICAL_DUE): replay_vertical_due,
    (S.REPLAY_HORIZONTAL, Trigger.HORIZONTAL_JUDGED): horizontal_judged,
    (S.REPLAY_VERTICAL, Trigger.REPLAY_CONCLUDED): replay_concluded,
    **{(stage, Trigger.SUSPEND): suspend_from(stage) for stage in ACTIVE},
    (S.RUNNING, Trigger.SUSPEND_SAVING): suspend_saving,
    (S.SAVING, Trigger.SAVE_COMMITTED): save_committed,
    (S.SAVING, Trigger.SAVE_GRACE_PASSED): save_grace_passed,
    (S.SAVING, Trigger.RESUMED): resumed_while_saving,
    (S.SUSPENDING, Trigger.NODES_STOPPED): suspended,
    (S.SUSPENDING, Trigger.RESUMED): resumed_while_suspending,
    (S.SUSPENDED, Trigger.RESUMED): resumed,
}


def test_every_row_has_a_scenario() -> None:
    assert set(SCENARIOS) == {(r.source, r.trigger) for r in TABLE}


def _name(row: Row) -> str:
    return f"{row.source.value if row.source else 'new'}-{row.trigger.name.lower()}"


@pytest.mark.parametrize("row", TABLE, ids=_name)
def test_row(row: Row, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = SCENARIOS[(row.source, row.trigger)]
    h = scenario(monkeypatch) if scenario is replay_horizontal_due else scenario()
    taken = [(r.source, r.trigger, r.target) for r in h.decision.transitions]
    assert taken[0] == (row.source, row.trigger, row.target), taken
    assert h.state().stage is taken[-1][2]
    assert h.state().phase is taken[-1][2].phase
    assert h.state().stage_since == h.clock.now
