"""A job controller on the in-memory fakes, and the agents' side of etcd played by hand.

h = Harness(spec={"standbys": {"count": 1}})
h.tick()                       # creates the job's state
h.join("node-0", "node-1")     # agents register
h.tick()                       # ... generation 1 starts
"""

from __future__ import annotations

import json
from typing import Any

from stalwart.controller import JobController
from stalwart.controller.core.decision import Decision
from stalwart.controller.core.observation import BeatChanges, Observation
from stalwart.spec import TrainingJob, parse_job
from stalwart.store import keys
from stalwart.store.jobs import read_spec
from stalwart.store.records import (
    Assignment,
    CheckpointEntry,
    Heartbeat,
    Incident,
    JobState,
    NodeAssignment,
    NodeRegistration,
    OperatorRequest,
    RequestKind,
    WorkerState,
    WorkerStatus,
)
from support.fakes import FakeClock, FakeCluster, ManualRunner, MemoryLease, MemoryStore

JOB = "unit-job"


def spec_document(**spec: Any) -> dict[str, Any]:
    """A small job (2 nodes x 2 workers), quick to reason about; `spec` keys are merged in."""
    doc: dict[str, Any] = {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": JOB},
        "spec": {
            "roles": [{"name": "trainer", "replicas": 2, "processesPerNode": 2, "command": ["python", "train.py"]}],
            "faultTolerance": {"heartbeatIntervalSeconds": 1, "leaseTtlSeconds": 5, "preflight": False},
            "failurePolicy": {"maxRestarts": 3},
            "standbys": {"count": 0},
            "checkpoint": {"intervalSteps": 10},
        },
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(doc["spec"].get(key), dict):
            doc["spec"][key] = {**doc["spec"][key], **value}
        else:
            doc["spec"][key] = value
    parse_job(doc, "test")  # a typo in a test's spec fails here, not in the controller
    return doc


def worker(rank: int, *, step: int | None = 5, exit_code: int | None = None, **fields: Any) -> WorkerStatus:
    at = fields.pop("at", 0.0)
    return WorkerStatus(
        local_rank=rank % 2,
        rank=rank,
        pid=1000 + rank,
        state=WorkerState.RUNNING if exit_code is None else WorkerState.EXITED,
        exit_code=exit_code,
        started_at=at,
        exited_at=None if exit_code is None else fields.pop("exited_at", at),
        step=step,
        last_progress_at=fields.pop("last_progress_at", at),
        **fields,
    )


def assignment_of(nodes: list[str], procs: int = 2, job: str = "j") -> Assignment:
    """Generation 1 of `nodes` x `procs` ranks, in order (what a diagnosis link reads)."""
    return Assignment(
        job=job,
        generation=1,
        world_size=procs * len(nodes),
        master_addr="h",
        master_port=1,
        nodes=[
            NodeAssignment(node=n, node_rank=i, role="trainer", first_rank=procs * i, local_world_size=procs)
            for i, n in enumerate(nodes)
        ],
        created_at=0.0,
    )


class Harness:
    def __init__(self, **spec: Any) -> None:
        self.store = MemoryStore()
        self.cluster = FakeCluster()
        self.clock = FakeClock()
        self.runner = ManualRunner(self.clock)
        self.leases: dict[str, MemoryLease] = {}
        self.set_spec(**spec)
        self.controller = self.new_controller()

    def new_controller(self, **kwargs: Any) -> JobController:
        """A controller (the previous one, if any, is dropped as if killed: it never releases)."""
        controller = JobController(self.store, self.cluster, JOB, clock=self.clock, runner=self.runner, **kwargs)
        self.store.put(controller.leader.key, controller.leader.identity)  # it leads (no lease thread)
        self.controller = controller
        return controller

    def set_spec(self, **spec: Any) -> None:
        self.store.put(keys.job_spec(JOB), json.dumps(spec_document(**spec)))

    # -- the controller --------------------------------------------------------------------------
    def tick(self, times: int = 1) -> JobState | None:
        state = None
        for _ in range(times):
            state = self.controller.tick()
        return state

    @property
    def decision(self) -> Decision:
        """The last tick's decision."""
        assert self.controller.last is not None
        return self.controller.last

    def taken(self) -> list[tuple[str | None, str, str]]:
        """The transitions the last tick took: (from, trigger, to)."""
        return [
            (r.source.value if r.source else None, r.trigger.value, r.target.value) for r in self.decision.transitions
        ]

    def state(self) -> JobState:
        state = self.store.get(keys.job_state(JOB), JobState)
        assert state is not None
        return state

    def put_state(self, **fields: Any) -> JobState:
        """Write the job's state directly (a stage to start a test from)."""
        base: dict[str, Any] = {
            "job": JOB,
            "slots": ["node-0", "node-1"],
            "next_node_index": 2,
            "created_at": self.clock.now - 100,
            "updated_at": self.clock.now - 100,
            "stage_since": self.clock.now - 1,
        }
        state = JobState(**{**base, **fields})
        self.store.put(keys.job_state(JOB), state)
        if state.generation:
            self.assign(state.generation, state.slots)
        return state

    def assign(self, generation: int, slots: list[str]) -> None:
        from stalwart.controller.core.ranks import assign

        job = read_spec(self.store, JOB)  # type: ignore[arg-type]
        assert job is not None
        self.store.put(
            keys.generation(JOB, generation),
            assign(JOB, job.spec, slots, generation, ("127.0.0.1", 1), created_at=self.clock.now),
        )

    def incidents(self) -> list[Incident]:
        return sorted(self.store.get_prefix(keys.incidents_prefix(JOB), Incident), key=lambda i: i.failed_at)

    def assignment(self, generation: int) -> Assignment | None:
        return self.store.get(keys.generation(JOB, generation), Assignment)

    def command(self, node: str) -> tuple[int, str] | None:
        from stalwart.store.records import AgentCommand

        cmd = self.store.get(keys.node_command(JOB, node), AgentCommand)
        return None if cmd is None else (cmd.generation, cmd.action.value)

    # -- the agents' side ------------------------------------------------------------------------
    def join(self, *nodes: str, generation: int = 0, workers: dict[str, list[WorkerStatus]] | None = None) -> None:
        """Nodes start (as far as the cluster knows), register under a lease and send a heartbeat."""
        for node in nodes:
            self.cluster.nodes.setdefault(node, self.cluster.nodes.get(node) or _alive(node))
            lease = self.store.lease(5)
            self.leases[node] = lease
            reg = NodeRegistration(
                node=node, job=JOB, host="h", agent_pid=1, registered_at=self.clock.now, lease_id=lease.id
            )
            self.store.put(keys.node_registration(JOB, node), reg, lease=lease)
            self.beat(node, generation, (workers or {}).get(node, []))

    def beat(self, node: str, generation: int, workers: list[WorkerStatus], **fields: Any) -> None:
        beat = Heartbeat(node=node, generation=generation, sent_at=self.clock.now, workers=workers, **fields)
        self.store.put(keys.node_heartbeat(JOB, node), beat, lease=self.leases[node])

    def running(self, generation: int = 1, slots: tuple[str, ...] = ("node-0", "node-1"), **fields: Any) -> None:
        """A job in generation `generation`, its slot nodes registered and stepping."""
        started = self.clock.now - 50
        self.put_state(
            stage="Running", generation=generation, slots=list(slots), generation_started_at=started, **fields
        )
        self.join(*slots, generation=generation)
        self.run_generation(generation, list(slots))

    def run_generation(self, generation: int, slots: list[str], **worker_fields: Any) -> None:
        """Every slot node reports its two workers of `generation` running."""
        for i, node in enumerate(slots):
            ranks = [2 * i, 2 * i + 1]
            self.beat(node, generation, [worker(r, at=self.clock.now, **worker_fields) for r in ranks])

    def lapse(self, node: str) -> None:
        """The node's lease lapses (its keys go)."""
        self.store.revoke_lease(self.leases.pop(node).id)

    def request(self, kind: RequestKind, node: str | None, request_id: str = "req-1") -> None:
        request = OperatorRequest(id=request_id, kind=kind, node=node, requested_at=self.clock.now, reason="test")
        self.store.put(keys.request(JOB, request_id), request)

    def request_record(self, request_id: str = "req-1") -> OperatorRequest:
        request = self.store.get(keys.request(JOB, request_id), OperatorRequest)
        assert request is not None
        return request


def _alive(node: str) -> Any:
    from stalwart.cluster.base import NodeInfo

    return NodeInfo(name=node, alive=True)


def heartbeats_only(
    now: float,
    state: JobState,
    spec: TrainingJob,
    beats: dict[str, Heartbeat],
    changes: BeatChanges | None,
    catalog: dict[int, CheckpointEntry] | None = None,
) -> Observation:
    """An observation of heartbeats (and a catalog) alone, for the detectors' digests: `changes` None
    says the changed nodes are not known (every node is read)."""
    return Observation(
        now=now,
        state=state,
        revision=1,
        spec=spec,
        registrations={},
        beats=dict(beats),
        commands={},
        vectors={},
        request=None,
        incident=None,
        beat_changes=changes,
        catalog=dict(catalog or {}),
    )
