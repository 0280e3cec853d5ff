"""Every row of the transition table, taken by the pure core on hand-built observations.

No store, no cluster, no controller loop: each case writes the job's records by hand (`Seen`), asks
`ReconcileCore.decide` for a decision, and checks that exactly its row was taken and what the
decision carries with it. A decision that needs more observation (the cluster, a rendezvous, an
incident) is answered from the same hand-built records; one that commits is applied to them, as
the shell would, before the next observation. `test_every_row_has_a_case` keeps the list complete:
a new row of the table without a case here fails it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from support.controller_harness import spec_document

from stalwart.cluster.base import NodeInfo, PreflightVerdict
from stalwart.controller.core.decision import Decision, Launch, Log, Needs, SendCommand, StartNode, StopNode
from stalwart.controller.core.detectors import default_detectors
from stalwart.controller.core.observation import Observation
from stalwart.controller.core.ranks import role_states
from stalwart.controller.core.reconcile import ReconcileCore
from stalwart.controller.core.transitions import ACTIVE, TABLE, WAITING_FOR_NODES, Row, Trigger
from stalwart.controller.core.work import CrashDiagnosis, NodeChecks, Work, WorkResult
from stalwart.spec import TrainingJob, parse_job
from stalwart.spec.model import FailureEvent
from stalwart.store import keys
from stalwart.store.records import (
    AgentAction,
    Assignment,
    CheckpointRequest,
    Heartbeat,
    Incident,
    JobStage,
    JobState,
    NodeRegistration,
    OperatorRequest,
    ReplayGroupRun,
    ReplayState,
    RequestKind,
    RequestStatus,
    SavedCheckpoint,
    Suspension,
    WorkerState,
    WorkerStatus,
)

S = JobStage
JOB = "table-job"
START = 50_000.0


def job_spec(**spec: Any) -> TrainingJob:
    """The controller harness's small job (2 nodes x 2 workers) under this module's name; `spec` keys
    are merged into its spec."""
    doc = spec_document(**spec)
    doc["metadata"]["name"] = JOB
    return parse_job(doc, "test")


def worker(rank: int, *, step: int | None = 5, exit_code: int | None = None, at: float = START) -> WorkerStatus:
    return WorkerStatus(
        local_rank=rank % 2,
        rank=rank,
        pid=1000 + rank,
        state=WorkerState.RUNNING if exit_code is None else WorkerState.EXITED,
        exit_code=exit_code,
        started_at=at,
        exited_at=None if exit_code is None else at,
        step=step,
        last_progress_at=at,
    )


class Seen:
    """The job's records as etcd and the cluster would hold them, written by hand, and a core that
    decides on them. `decide()` observes, decides and applies the decision as a commit would."""

    def __init__(self, **spec: Any) -> None:
        self.spec = job_spec(**spec)
        self.now = START
        self.state: JobState | None = None
        self.revision = 0
        self.records: dict[str, Any] = {}  # what decisions wrote (incidents, assignments, requests...)
        self.registrations: dict[str, NodeRegistration] = {}
        self.beats: dict[str, Heartbeat] = {}
        self.cluster: dict[str, NodeInfo] = {}
        self.request: tuple[OperatorRequest, int] | None = None
        self.results: dict[tuple[str, ...], WorkResult] = {}
        self.launched: list[Work] = []
        self.free_machines: int | None = None  # what the cluster says with its listing (None: no limit)
        ids = itertools.count(1)
        self.core = ReconcileCore(JOB, default_detectors(), new_id=lambda: f"id{next(ids)}")

    # -- the records ---------------------------------------------------------------------------
    def put_state(self, **fields: Any) -> JobState:
        base: dict[str, Any] = {
            "job": JOB,
            "slots": ["node-0", "node-1"],
            "next_node_index": 2,
            "created_at": self.now - 100,
            "updated_at": self.now - 100,
            "stage_since": self.now - 1,
        }
        self.state = JobState(**{**base, **fields})
        self.revision += 1
        return self.state

    def join(self, *nodes: str, generation: int = 0, workers: list[WorkerStatus] | None = None) -> None:
        """Nodes alive in the cluster, registered, with a heartbeat."""
        for node in nodes:
            self.cluster[node] = NodeInfo(name=node, alive=True)
            self.registrations[node] = NodeRegistration(
                node=node, job=JOB, host="h", agent_pid=1, registered_at=self.now, lease_id=1
            )
            self.beat(node, generation, workers or [])

    def beat(self, node: str, generation: int, workers: list[WorkerStatus], **fields: Any) -> None:
        self.beats[node] = Heartbeat(node=node, generation=generation, sent_at=self.now, workers=workers, **fields)

    def running(self, generation: int = 1, **fields: Any) -> None:
        """Generation `generation` runs on node-0 and node-1, two workers each, stepping."""
        self.put_state(stage=S.RUNNING, generation=generation, generation_started_at=self.now - 50, **fields)
        self.join("node-0", "node-1", generation=generation)
        for i, node in enumerate(["node-0", "node-1"]):
            self.beat(node, generation, [worker(r, at=self.now) for r in (2 * i, 2 * i + 1)])

    def finish(self, kind: type[Work], **result: Any) -> None:
        """The launched work of `kind` comes back with `result`."""
        for work in self.launched:
            if isinstance(work, kind) and work.key not in self.results:
                self.results[work.key] = WorkResult(work, self.now, **result)

    def check_verdicts(self, failing: dict[str, list[str]]) -> None:
        """Every node check launched comes back: the nodes in `failing` failed for those reasons."""
        for work in self.launched:
            if isinstance(work, NodeChecks) and work.key not in self.results:
                verdicts = [
                    PreflightVerdict(node=n, passed=n not in failing, reasons=failing.get(n, [])) for n in work.nodes
                ]
                self.results[work.key] = WorkResult(work, self.now, verdicts=verdicts)

    # -- observe, decide, commit ---------------------------------------------------------------
    def observe(self) -> Observation:
        return Observation(
            now=self.now,
            state=self.state,
            revision=self.revision,
            spec=self.spec,
            registrations=dict(self.registrations),
            beats=dict(self.beats),
            commands={},
            vectors={},
            request=self.request,
            incident=self.records.get(keys.incident(JOB, self.state.open_incident))
            if self.state is not None and self.state.open_incident
            else None,
            cluster=dict(self.cluster),
            free_machines=self.free_machines,
            results=dict(self.results),
            in_flight=frozenset(w.key for w in self.launched if w.key not in self.results),
        )

    def complete(self, obs: Observation, needs: Needs) -> Observation:
        """What the shell's Observer would add for `needs`, from the hand-built records."""
        rendezvous = {**obs.rendezvous, **dict.fromkeys(needs.rendezvous, ("127.0.0.1", 29500))}
        incidents = {**obs.incidents, **{i: self.records.get(keys.incident(JOB, i)) for i in needs.incidents}}
        return replace(obs, rendezvous=rendezvous, incidents=incidents)

    def decide(self) -> Decision:
        obs = self.observe()
        decided = self.core.decide(obs)
        for _ in range(3):
            if isinstance(decided, Decision):
                break
            obs = self.complete(obs, decided)
            decided = self.core.decide(obs)
        assert isinstance(decided, Decision), f"the core still needs {decided}"
        self.apply(decided)
        return decided

    def apply(self, decision: Decision) -> None:
        """Commit the decision to the hand-built records, as the shell's commit and actuator would."""
        if decision.state is not None:
            self.state, self.revision = decision.state, self.revision + 1
        self.records.update(decision.puts)
        for key in decision.deletes:
            self.records.pop(key, None)
        for key in decision.consumed:
            self.results.pop(key, None)
        self.launched += [e.work for e in decision.effects if isinstance(e, Launch)]
        if self.request is not None and keys.request(JOB, self.request[0].id) in decision.puts:
            self.request = None
        self.core.acknowledge(decision, self.now)

    # -- what to check -------------------------------------------------------------------------
    def incidents(self) -> list[Incident]:
        return [r for r in self.records.values() if isinstance(r, Incident)]

    def commands(self, decision: Decision) -> dict[str, tuple[int, AgentAction]]:
        return {e.node: (e.generation, e.action) for e in decision.effects if isinstance(e, SendCommand)}

    def the_state(self) -> JobState:
        assert self.state is not None
        return self.state


Case = Callable[[], tuple[Seen, Decision]]


# -- Pending and Starting ----------------------------------------------------------------------
def created() -> tuple[Seen, Decision]:
    seen = Seen(standbys={"count": 1})
    decision = seen.decide()
    state = seen.the_state()
    assert state.slots == ["node-0", "node-1"] and state.standbys == ["node-2"]
    return seen, decision


def starting_to_preflight() -> tuple[Seen, Decision]:
    seen = Seen(faultTolerance={"preflight": True})
    seen.put_state(stage=S.STARTING)
    seen.join("node-0", "node-1")
    decision = seen.decide()
    assert [e.work.key for e in decision.effects if isinstance(e, Launch)] == [("checks", "preflight", "1")]
    return seen, decision


def starting_to_running() -> tuple[Seen, Decision]:
    seen = Seen()
    seen.put_state(stage=S.STARTING)
    seen.join("node-0", "node-1")
    decision = seen.decide()
    assignment = decision.puts[keys.generation(JOB, 1)]
    assert isinstance(assignment, Assignment) and assignment.created_at == seen.now
    assert assignment.rank_nodes() == {0: "node-0", 1: "node-0", 2: "node-1", 3: "node-1"}
    assert seen.commands(decision) == {"node-0": (1, AgentAction.RUN), "node-1": (1, AgentAction.RUN)}
    return seen, decision


def starting_never_ready() -> tuple[Seen, Decision]:
    seen = Seen()
    seen.put_state(stage=S.STARTING, stage_since=seen.now - 301)
    seen.join("node-0")
    decision = seen.decide()
    state = seen.the_state()
    assert state.reason == "NodesNotReady" and "node-1" in (state.message or "")
    return seen, decision


def nodes_keep_dying_in(stage: JobStage) -> Case:
    def case() -> tuple[Seen, Decision]:
        seen = Seen()
        seen.put_state(stage=stage, died_before_joining=6)  # 3 per slot of the 2 already replaced
        seen.join("node-0")
        seen.cluster["node-1"] = NodeInfo(name="node-1", alive=False)
        decision = seen.decide()
        state = seen.the_state()
        assert state.reason == "NodesDiedBeforeJoining" and state.died_before_joining == 7
        assert state.slots == ["node-0", "node-1"]  # no node started for a start that cannot succeed
        assert not [e for e in decision.effects if isinstance(e, StartNode)]
        return seen, decision

    return case


# -- Preflight ---------------------------------------------------------------------------------
def _preflight(failing: dict[str, list[str]], **fields: Any) -> tuple[Seen, Decision]:
    seen = Seen(faultTolerance={"preflight": True})
    seen.put_state(stage=S.PREFLIGHT, **fields)
    seen.join("node-0", "node-1")
    first = seen.decide()  # launches the checks (a controller that restarted mid-check runs them again)
    assert first.transitions == []
    seen.check_verdicts(failing)
    return seen, seen.decide()


def preflight_passed() -> tuple[Seen, Decision]:
    seen, decision = _preflight({})
    state = seen.the_state()
    assert state.generation == 1 and state.preflight_rounds == 1 and seen.incidents() == []
    return seen, decision


def preflight_retry() -> tuple[Seen, Decision]:
    seen, decision = _preflight({"node-1": ["compute check: wrong bits"]})
    state = seen.the_state()
    assert state.slots == ["node-0", "node-2"] and state.evicted == ["node-1"] and state.restarts == 0
    [incident] = seen.incidents()
    assert incident.failure_class.value == "PreflightFailed" and not incident.counted
    return seen, decision


def preflight_exhausted() -> tuple[Seen, Decision]:
    seen, decision = _preflight({"node-1": ["collective timed out"]}, preflight_rounds=2)
    assert seen.the_state().reason == "PreflightFailed"
    return seen, decision


# -- Running -----------------------------------------------------------------------------------
def succeeded() -> tuple[Seen, Decision]:
    seen = Seen()
    seen.running()
    for i, node in enumerate(["node-0", "node-1"]):
        seen.beat(node, 1, [worker(r, step=60, exit_code=0) for r in (2 * i, 2 * i + 1)])
    decision = seen.decide()
    state = seen.the_state()
    assert state.reason == "Completed" and state.last_step == 60
    return seen, decision


def test_a_generation_that_resumed_at_the_last_step_succeeds_at_that_step() -> None:
    """Evicted just before the end, the next generation resumed at the last step's checkpoint and
    trained none: the job's step is that checkpoint's, not the last one a worker reported."""
    seen = Seen()
    seen.running()
    for i, node in enumerate(["node-0", "node-1"]):
        seen.beat(node, 1, [worker(r, step=None, exit_code=0) for r in (2 * i, 2 * i + 1)])
    seen.beat("node-0", 1, seen.beats["node-0"].workers, checkpoints=[SavedCheckpoint(step=60, committed_at=seen.now)])
    seen.decide()
    state = seen.the_state()
    assert state.reason == "Completed" and state.last_step == 60


def failure_handled() -> tuple[Seen, Decision]:
    """A lost node, hot-swapped: the standby takes its slot, the incident is committed with it."""
    seen = Seen(standbys={"count": 1})
    seen.running(standbys=["node-2"], next_node_index=3, standbys_checked=["node-2"])
    seen.join("node-2")
    seen.now += 1
    del seen.registrations["node-1"]  # its lease lapsed; its last heartbeat stays
    decision = seen.decide()
    state = seen.the_state()
    assert state.slots == ["node-0", "node-2"] and state.standbys == ["node-3"] and state.evicted == ["node-1"]
    [incident] = seen.incidents()
    assert incident.failure_class is FailureEvent.LOST_NODE and incident.replacements == {"node-1": "node-2"}
    assert state.open_incident == incident.id
    return seen, decision


def failure_checked() -> tuple[Seen, Decision]:
    """A worker killed with no message: diagnosis reads its logs (off the loop), then a restart
    after stop-time checks."""
    seen = Seen()
    seen.running()
    seen.now += 1
    seen.beat("node-0", 1, [worker(0, at=seen.now), worker(1, exit_code=-9, at=seen.now - 0.5)])
    seen.beat("node-1", 1, [worker(2, at=seen.now), worker(3, at=seen.now)])
    waiting = seen.decide()
    assert waiting.transitions == [] and [type(w) for w in seen.launched] == [CrashDiagnosis]
    seen.finish(CrashDiagnosis, diagnosis=None)
    decision = seen.decide()
    assert seen.the_state().restarts == 1
    [incident] = seen.incidents()
    assert incident.failure_class is FailureEvent.WORKER_CRASH and incident.rank == 1 and incident.node == "node-0"
    assert "run stop-time checks" in incident.action
    return seen, decision


def failure_fatal() -> tuple[Seen, Decision]:
    seen = Seen(failurePolicy={"maxRestarts": 0})
    seen.running()
    seen.now += 1
    seen.beat("node-0", 1, [worker(0, at=seen.now), worker(1, exit_code=-9, at=seen.now - 0.5)])
    seen.beat("node-1", 1, [worker(2, at=seen.now), worker(3, at=seen.now)])
    seen.decide()
    seen.finish(CrashDiagnosis, diagnosis=None)
    decision = seen.decide()
    assert seen.the_state().reason == "RestartBudgetExhausted"
    [incident] = seen.incidents()
    assert incident.policy_action is not None and incident.policy_action.value == "Fail"
    return seen, decision


def evict_requested() -> tuple[Seen, Decision]:
    seen = Seen(standbys={"count": 1})
    seen.running(standbys=["node-2"], next_node_index=3)
    seen.join("node-2")
    request = OperatorRequest(id="req-1", kind=RequestKind.EVICT, node="node-1", requested_at=seen.now, reason="test")
    seen.request = (request, 7)
    decision = seen.decide()
    assert seen.the_state().slots == ["node-0", "node-2"] and decision.guards == {keys.request(JOB, "req-1"): 7}
    answered = decision.puts[keys.request(JOB, "req-1")]
    assert isinstance(answered, OperatorRequest) and answered.status is RequestStatus.DONE
    return seen, decision


# -- Restarting, checks and replay -------------------------------------------------------------
def restarted() -> tuple[Seen, Decision]:
    seen = Seen()
    seen.put_state(stage=S.RESTARTING, generation=1, restarts=1)
    seen.join("node-0", "node-1", generation=1)
    decision = seen.decide()
    assert seen.the_state().generation == 2 and seen.commands(decision)["node-1"] == (2, AgentAction.RUN)
    return seen, decision


def restarting_never_ready() -> tuple[Seen, Decision]:
    seen = Seen()
    seen.put_state(stage=S.RESTARTING, generation=1, restarts=1, stage_since=seen.now - 599)
    seen.join("node-0", generation=1)  # node-1's replacement was never started: no machine free
    waiting = seen.decide()
    assert seen.the_state().stage is S.RESTARTING and not waiting.puts.get(keys.generation(JOB, 2))
    seen.now += 2  # past faultTolerance.restartTimeoutSeconds (600 by default)
    decision = seen.decide()
    state = seen.the_state()
    assert state.reason == "CapacityUnavailable" and "node-1" in (state.message or "")
    assert "runbook show capacity_unavailable" in (state.message or "")
    return seen, decision


# -- elastic data parallelism (minReplicas) -----------------------------------------------------
ELASTIC_ROLES = [
    {"name": "trainer", "replicas": 3, "minReplicas": 2, "processesPerNode": 2, "command": ["python", "train.py"]}
]


def elastic_restart() -> Seen:
    """3 nodes (minReplicas 2) restarting after node-1 was lost: its replacement node-3 was never
    started (no standby, no machine free); node-0 and node-2 are back."""
    seen = Seen(roles=ELASTIC_ROLES)
    incident = Incident(
        id="inc-lost",
        job=JOB,
        failure_class=FailureEvent.LOST_NODE,
        generation=1,
        node="node-1",
        action="evict node-1 (standby node-3)",
        failed_at=seen.now - 10,
        detected_at=seen.now - 5,
    )
    seen.records[keys.incident(JOB, incident.id)] = incident
    seen.put_state(
        stage=S.RESTARTING,
        generation=1,
        slots=["node-0", "node-3", "node-2"],
        next_node_index=4,
        evicted=["node-1"],
        open_incident=incident.id,
        roles=role_states(seen.spec.spec),
    )
    seen.join("node-0", "node-2", generation=1)
    seen.free_machines = 0
    return seen


def shrunk() -> tuple[Seen, Decision]:
    seen = elastic_restart()
    decision = seen.decide()
    state = seen.the_state()
    assert state.slots == ["node-0", "node-2"] and state.standbys == ["node-3"]
    assert state.standby_roles == {"node-3": "trainer"}  # asked for again: a machine that frees takes it
    role = state.roles["trainer"]
    assert (role.nodes, role.world_size) == (2, 4)
    [resize] = state.resizes
    assert (resize.from_replicas, resize.to_replicas, resize.replicas) == (3, 2, 3)
    assert resize.capacity == pytest.approx(2 / 3)
    [incident] = seen.incidents()
    assert incident.resize == resize and "shrink trainer from 3 to 2 nodes" in incident.action
    return seen, decision


def elastic_running() -> Seen:
    """The job of elastic_restart, shrunk to node-0 and node-2 and running generation 2; node-3 has
    registered as the role's standby since (its machine came back)."""
    seen = Seen(roles=ELASTIC_ROLES)
    roles = role_states(seen.spec.spec)
    roles["trainer"].nodes, roles["trainer"].world_size = 2, 4
    seen.put_state(
        stage=S.RUNNING,
        generation=2,
        generation_started_at=seen.now - 50,
        slots=["node-0", "node-2"],
        next_node_index=4,
        standbys=["node-3"],
        standby_roles={"node-3": "trainer"},
        roles=roles,
    )
    for i, node in enumerate(["node-0", "node-2"]):
        seen.join(node, generation=2)
        seen.beat(node, 2, [worker(r, step=21) for r in (2 * i, 2 * i + 1)])
    seen.join("node-3")
    return seen


def grown() -> tuple[Seen, Decision]:
    seen = elastic_running()
    # Capacity is back, but no checkpoint since: it asks the workers for one just ahead, and waits.
    quiet = seen.decide()
    assert quiet.transitions == [] and seen.the_state().slots == ["node-0", "node-2"]
    request = quiet.puts[keys.checkpoint_request(JOB)]
    assert isinstance(request, CheckpointRequest) and request.generation == 2 and request.step > 21
    assert request.reason == "grow" and seen.the_state().grow_checkpoint_generation == 2
    assert keys.checkpoint_request(JOB) not in seen.decide().puts  # asked once per generation
    seen.beat("node-0", 2, seen.beats["node-0"].workers, checkpoints=[SavedCheckpoint(step=20, committed_at=seen.now)])
    decision = seen.decide()
    assert keys.checkpoint_request(JOB) in decision.deletes
    state = seen.the_state()
    assert state.slots == ["node-0", "node-2", "node-3"] and state.standbys == []
    assert (state.roles["trainer"].nodes, state.roles["trainer"].world_size) == (3, 6)
    [incident] = seen.incidents()
    assert incident.failure_class is FailureEvent.ELASTIC_GROW and not incident.counted
    assert incident.resize is not None and (incident.resize.from_replicas, incident.resize.to_replicas) == (2, 3)
    assert state.open_incident == incident.id and state.resizes[-1].capacity == 1.0
    return seen, decision


def checks_done() -> tuple[Seen, Decision]:
    seen = Seen()
    seen.put_state(stage=S.CHECKING, generation=1)
    seen.join("node-0", "node-1", generation=1)
    seen.beat("node-0", 1, [worker(0), worker(1, exit_code=-9)])  # one worker still running
    waiting = seen.decide()
    assert seen.launched == [] and seen.commands(waiting)["node-0"] == (1, AgentAction.STOP)
    seen.beat("node-0", 1, [worker(0, exit_code=-15), worker(1, exit_code=-9)])
    seen.decide()
    assert [w.key for w in seen.launched] == [("checks", "stop-time", "1")]
    seen.check_verdicts({})
    decision = seen.decide()
    assert seen.the_state().unexplained_failures == 1 and seen.the_state().replay is None
    return seen, decision


def _checks_pass_with_replay_after_one(seen: Seen) -> Decision:
    seen.put_state(stage=S.CHECKING, generation=1, generation_started_at=seen.now - 10)
    seen.join("node-0", "node-1", generation=1)
    seen.decide()
    seen.check_verdicts({})
    return seen.decide()


def replay_horizontal_due(monkeypatch: pytest.MonkeyPatch) -> tuple[Seen, Decision]:
    """A plan with horizontal groups to run (what a pipeline layout gives)."""
    from stalwart.controller.core import checks

    def two_by_one(spec: object, slots: list[str], role: str | None = None) -> ReplayState:
        return ReplayState(
            horizontal=[ReplayGroupRun(id="h0", nodes=slots)],
            vertical=[ReplayGroupRun(id=f"v{i}", nodes=[n]) for i, n in enumerate(slots)],
        )

    monkeypatch.setattr(checks, "plan_phases", two_by_one)
    seen = Seen(failurePolicy={"replayAfter": 1})
    return seen, _checks_pass_with_replay_after_one(seen)


def replay_vertical_due() -> tuple[Seen, Decision]:
    seen = Seen(failurePolicy={"replayAfter": 1})
    decision = _checks_pass_with_replay_after_one(seen)
    replay = seen.the_state().replay
    assert replay is not None and [g.nodes for g in replay.vertical] == [["node-0"], ["node-1"]]
    return seen, decision


def _replay(stage: JobStage, outcomes: dict[str, str]) -> tuple[Seen, Decision]:
    """A replay phase launched as generation 3: each node's workers end as `outcomes` says."""
    seen = Seen(failurePolicy={"replayAfter": 1})
    horizontal = [ReplayGroupRun(id="h0", nodes=["node-0", "node-1"])]
    if stage is S.REPLAY_VERTICAL:
        horizontal[0].outcome, horizontal[0].reason = "failed", "the whole job"
    replay = ReplayState(
        horizontal=horizontal,
        vertical=[ReplayGroupRun(id="v0", nodes=["node-0"]), ReplayGroupRun(id="v1", nodes=["node-1"])],
        generation=3,
        started_at=seen.now,
    )
    incident = Incident(
        id="inc-1", job=JOB, failure_class=FailureEvent.WORKER_CRASH, generation=2, failed_at=0, detected_at=0
    )
    seen.records[keys.incident(JOB, "inc-1")] = incident
    seen.put_state(
        stage=stage, generation=3, replay=replay, standbys=["node-2"], next_node_index=3, open_incident="inc-1"
    )
    seen.join("node-0", "node-1", "node-2", generation=3)
    assert seen.decide().transitions == []  # nothing judged yet
    for node, outcome in outcomes.items():
        code = 0 if outcome == "passed" else 134
        first = 0 if stage is S.REPLAY_VERTICAL or node == "node-0" else 2
        seen.beat(node, 3, [worker(first + i, exit_code=code) for i in range(2)])
    return seen, seen.decide()


def horizontal_judged() -> tuple[Seen, Decision]:
    seen, decision = _replay(S.REPLAY_HORIZONTAL, {"node-0": "failed", "node-1": "passed"})
    replay = seen.the_state().replay
    assert replay is not None and replay.generation is None and replay.horizontal[0].outcome == "failed"
    return seen, decision


def replay_concluded() -> tuple[Seen, Decision]:
    seen, decision = _replay(S.REPLAY_VERTICAL, {"node-0": "passed", "node-1": "failed"})
    state = seen.the_state()
    assert state.evicted == ["node-1"] and state.slots == ["node-0", "node-2"] and state.replay is None
    [incident] = seen.incidents()
    assert "dual-phase replay found node-1" in incident.action and incident.evicted == ["node-1"]
    return seen, decision


# -- Suspending and Suspended ------------------------------------------------------------------
def suspend_from(stage: JobStage) -> Case:
    def case() -> tuple[Seen, Decision]:
        # (A running job's checkpoint first is its own row: here the spec leaves it out.)
        seen = Seen(suspend=True, checkpoint={"saveBeforeSuspendSeconds": 0})
        if stage is S.RUNNING:
            seen.running()
        else:
            seen.put_state(stage=stage, generation=1 if stage is not S.STARTING else 0)
            seen.join("node-0", "node-1")
        decision = seen.decide()
        state = seen.the_state()
        assert state.suspensions[-1].ended_at is None and seen.incidents() == [] and state.restarts == 0
        assert sorted(e.node for e in decision.effects if isinstance(e, StopNode)) == ["node-0", "node-1"]
        return seen, decision

    return case


def suspend_saving() -> tuple[Seen, Decision]:
    """Workers at step 5 with a 0.1 s pace: the save is asked 2 s of steps ahead, and they run on."""
    seen = Seen(suspend=True)
    seen.running()
    for i, node in enumerate(["node-0", "node-1"]):
        seen.beat(node, 1, [worker(r, at=seen.now).model_copy(update={"step_time": 0.1}) for r in (2 * i, 2 * i + 1)])
    decision = seen.decide()
    state = seen.the_state()
    request = seen.records[keys.checkpoint_request(JOB)]
    assert isinstance(request, CheckpointRequest) and request.generation == 1 and request.step == 5 + 20
    assert state.suspensions[-1].save_step == 25 and state.suspensions[-1].saved_step is None
    assert not any(isinstance(e, StopNode) for e in decision.effects) and seen.incidents() == []
    assert not any(isinstance(e, SendCommand) and e.action is AgentAction.STOP for e in decision.effects)
    return seen, decision


def _saving(seen: Seen, asked: int = 25) -> None:
    seen.put_state(stage=S.SAVING, generation=1, suspensions=[Suspension(started_at=seen.now - 1, save_step=asked)])
    seen.join("node-0", "node-1", generation=1)
    seen.records[keys.checkpoint_request(JOB)] = "the request"


def save_committed() -> tuple[Seen, Decision]:
    seen = Seen(suspend=True)
    _saving(seen)
    saved = SavedCheckpoint(step=25, generation=1, committed_at=seen.now)
    seen.beat("node-1", 1, [worker(2), worker(3)], checkpoints=[saved])
    decision = seen.decide()
    state = seen.the_state()
    assert state.suspensions[-1].saved_step == 25 and keys.checkpoint_request(JOB) not in seen.records
    assert keys.checkpoint_entry(JOB, 25) in decision.puts  # in the catalog, as the checkpoint to resume from
    assert sorted(e.node for e in decision.effects if isinstance(e, StopNode)) == ["node-0", "node-1"]
    return seen, decision


def save_grace_passed() -> tuple[Seen, Decision]:
    seen = Seen(suspend=True, checkpoint={"saveBeforeSuspendSeconds": 30})
    _saving(seen)
    older = SavedCheckpoint(step=20, generation=1, committed_at=seen.now)  # a periodic one: not what was asked
    seen.beat("node-1", 1, [worker(2), worker(3)], checkpoints=[older])
    seen.now += 31
    decision = seen.decide()
    state = seen.the_state()
    assert state.suspensions[-1].saved_step is None and keys.checkpoint_request(JOB) not in seen.records
    logs = [e for e in decision.effects if isinstance(e, Log)]
    assert any(log.level == "warning" and "without the checkpoint" in log.message for log in logs)
    return seen, decision


def resumed_while_saving() -> tuple[Seen, Decision]:
    seen = Seen()
    _saving(seen)
    decision = seen.decide()
    state = seen.the_state()
    assert state.generation == 1 and state.suspensions[-1].ended_at == seen.now  # the generation goes on
    assert keys.checkpoint_request(JOB) not in seen.records
    return seen, decision


def suspended() -> tuple[Seen, Decision]:
    seen = Seen(suspend=True)
    seen.put_state(stage=S.SUSPENDING, generation=1)  # the cluster knows none of its nodes
    return seen, seen.decide()


def resumed_while_suspending() -> tuple[Seen, Decision]:
    seen = Seen()
    seen.put_state(stage=S.SUSPENDING, generation=1)
    seen.cluster["node-0"] = NodeInfo(name="node-0", alive=True)
    return seen, seen.decide()


def resumed() -> tuple[Seen, Decision]:
    seen = Seen()
    seen.put_state(stage=S.SUSPENDED, generation=4, suspensions=[Suspension(started_at=seen.now - 60)])
    decision = seen.decide()
    state = seen.the_state()
    assert state.suspensions[-1].ended_at == seen.now and state.generation == 4
    return seen, decision


CASES: dict[tuple[JobStage | None, Trigger], Callable[..., tuple[Seen, Decision]]] = {
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


def test_every_row_has_a_case() -> None:
    assert set(CASES) == {(r.source, r.trigger) for r in TABLE}


def _name(row: Row) -> str:
    return f"{row.source.value if row.source else 'new'}-{row.trigger.name.lower()}"


@pytest.mark.parametrize("row", TABLE, ids=_name)
def test_the_core_takes_the_row(row: Row, monkeypatch: pytest.MonkeyPatch) -> None:
    case = CASES[(row.source, row.trigger)]
    seen, decision = case(monkeypatch) if case is replay_horizontal_due else case()
    assert decision.transitions == [row]
    assert decision.state is not None and decision.state.stage is row.target
    assert seen.the_state().stage is row.target


def test_a_terminal_job_decides_nothing() -> None:
    seen = Seen()
    seen.put_state(stage=S.SUCCEEDED, finished_at=seen.now - 5)
    decision = seen.decide()
    assert decision.state is None and decision.effects == [] and decision.transitions == []


def test_a_shrunk_role_starts_its_next_generation_on_the_nodes_it_kept() -> None:
    seen, _ = shrunk()
    started = seen.decide()  # the kept nodes are registered: generation 2 at 2 nodes, 4 ranks
    assignment = started.puts[keys.generation(JOB, 2)]
    assert isinstance(assignment, Assignment) and assignment.world_size == 4
    assert [n.node for n in assignment.nodes] == ["node-0", "node-2"]
    assert seen.the_state().stage is S.RUNNING
    assert not [e for e in started.effects if isinstance(e, StartNode)]  # node-3 waits: recovering


def test_no_shrink_while_the_cluster_may_still_place_the_node() -> None:
    for free in (None, 1):
        seen = elastic_restart()
        seen.free_machines = free
        decision = seen.decide()
        assert decision.transitions == [] and seen.the_state().slots == ["node-0", "node-3", "node-2"]


def test_no_shrink_below_min_replicas() -> None:
    seen = elastic_restart()
    del seen.registrations["node-2"], seen.cluster["node-2"]  # node-2 is gone too: 1 node left, min is 2
    decision = seen.decide()
    assert decision.transitions == [] and len(seen.the_state().slots) == 3


def test_a_grown_role_starts_its_next_generation_at_full_size() -> None:
    seen, _ = grown()
    started = seen.decide()
    assignment = started.puts[keys.generation(JOB, 3)]
    assert isinstance(assignment, Assignment) and assignment.world_size == 6
    assert seen.the_state().stage is S.RUNNING


def test_a_replacement_pod_the_scheduler_cannot_place_shrinks_the_role_too() -> None:
    seen = elastic_restart()
    seen.cluster["node-3"] = NodeInfo(name="node-3", alive=True, unschedulable=True)  # Pending on Kubernetes
    decision = seen.decide()
    assert [r.trigger for r in decision.transitions] == [Trigger.SHRUNK]
    assert seen.the_state().slots == ["node-0", "node-2"]


def test_a_shrunk_role_moves_the_roles_after_it() -> None:
    roles = [*ELASTIC_ROLES, {"name": "reward", "replicas": 1, "processesPerNode": 1, "command": ["python", "r.py"]}]
    seen = Seen(roles=roles)
    seen.put_state(
        stage=S.RESTARTING,
        generation=1,
        slots=["node-0", "node-4", "node-2", "node-3"],  # node-1's replacement node-4 was never started
        next_node_index=5,
        roles=role_states(seen.spec.spec),
    )
    seen.join("node-0", "node-2", "node-3", generation=1)
    seen.free_machines = 0
    seen.decide()
    state = seen.the_state()
    assert state.role_slots("trainer") == ["node-0", "node-2"] and state.role_slots("reward") == ["node-3"]
    assert (state.roles["reward"].first_slot, state.roles["reward"].first_rank) == (2, 4)
    started = seen.decide()
    assignment = started.puts[keys.generation(JOB, 2)]
    assert isinstance(assignment, Assignment) and assignment.world_size == 5


def test_a_shrunk_role_asks_again_for_a_node_it_lacks_when_one_dies() -> None:
    seen, _ = shrunk()
    seen.decide()  # generation 2 runs at 2 nodes
    seen.cluster["node-3"] = NodeInfo(name="node-3", alive=False)  # the machine came, its agent died
    for i, node in enumerate(["node-0", "node-2"]):
        seen.beat(node, 2, [worker(r, step=12) for r in (2 * i, 2 * i + 1)])
    seen.decide()
    state = seen.the_state()
    assert "node-3" in state.evicted and len(state.standbys) == 1 and state.standbys[0] != "node-3"
    assert state.standby_roles[state.standbys[0]] == "trainer"
