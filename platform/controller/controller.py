"""The job controller: a level-triggered state machine whose state lives in etcd.

Each tick reads the job's state and its nodes' heartbeats, decides, and commits the decision in
one guarded transaction (only while we are the leader and nobody changed the state under us).
Side effects on nodes (commands, starting and stopping machines) are derived from the committed
state and are idempotent, so a controller killed at any point is replaced by one that carries on
from etcd: it neither repeats a restart nor forgets an incident.

    Pending --all nodes registered--> Running --worker exit != 0 / lost lease--> Restarting
    Restarting --replacements registered--> Running (generation + 1)
    Running --every worker exited 0--> Succeeded      any --restart budget spent--> Failed
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from stalwart.cluster import Cluster
from stalwart.controller.leader import Leadership
from stalwart.controller.ranks import assign, slot_roles
from stalwart.logs import ContextLogger, get_logger
from stalwart.spec import TrainingJob, parse_job
from stalwart.store import keys
from stalwart.store.client import LeaseLost, Store
from stalwart.store.nodes import read_nodes
from stalwart.store.records import (
    AgentAction,
    AgentCommand,
    Assignment,
    FailureClass,
    Heartbeat,
    Incident,
    JobPhase,
    JobState,
    NodeRegistration,
    WorkerStatus,
)

TICK_SECONDS = 0.1
STARTUP_TIMEOUT_SECONDS = 300.0
SHUTDOWN_WAIT_SECONDS = 30.0
PROGRESS_PERSIST_SECONDS = 5.0
MAX_PREFLIGHT_ROUNDS = 3


@dataclass
class Failure:
    failure_class: FailureClass
    node: str
    failed_at: float
    rank: int | None = None
    exit_code: int | None = None
    evidence: list[str] | None = None


class NotLeader(RuntimeError):
    pass


class JobController:
    def __init__(self, store: Store, cluster: Cluster, job_name: str) -> None:
        self.store = store
        self.cluster = cluster
        self.job_name = job_name
        raw = store.get_raw(keys.job_spec(job_name))
        if raw is None:
            raise ValueError(f"job {job_name!r} not found in etcd ({keys.job_spec(job_name)})")
        self.job: TrainingJob = parse_job(json.loads(raw), keys.job_spec(job_name))
        self.ft = self.job.spec.fault_tolerance
        self.leader = Leadership(store, job_name, ttl=self.ft.lease_ttl_seconds)
        self.log: ContextLogger = get_logger("stalwart.controller", job=job_name)
        # Last heartbeat seen per node: when a lease lapses its heartbeat key vanishes with it.
        self._last_beats: dict[str, Heartbeat] = {}
        self._pending_since = time.monotonic()

    # -- the loop ------------------------------------------------------------------------------
    def run(self, leader_timeout: float = 60.0) -> JobPhase:
        if not self.leader.acquire(timeout=leader_timeout):
            raise NotLeader(f"another controller holds {self.leader.key}")
        self.log.info("leading", fields={"identity": self.leader.identity})
        try:
            while True:
                self.leader.keep()
                self.tick()
                # Decide from what etcd holds, never from an object a failed commit left changed.
                state = self.store.get(keys.job_state(self.job_name), JobState)
                if state is not None and state.phase.terminal:
                    self._finish(state)
                    return state.phase
                time.sleep(TICK_SECONDS)
        except LeaseLost:
            raise NotLeader("leadership lapsed") from None
        finally:
            self.leader.release()

    def tick(self) -> JobState | None:
        state, revision = self.store.get_with_revision(keys.job_state(self.job_name), JobState)
        if state is None:
            self._create(time.time())
            return None
        log = self.log.bind(generation=state.generation, phase=state.phase.value)
        handler = {
            JobPhase.PENDING: self._pending,
            JobPhase.RUNNING: self._running,
            JobPhase.RESTARTING: self._restarting,
        }.get(state.phase)
        if handler is not None:
            handler(state, revision, log)
        return state

    def _commit(self, state: JobState, revision: int, extra: dict[str, Incident | Assignment] | None = None) -> bool:
        state.updated_at = time.time()
        puts: dict[str, JobState | Incident | Assignment] = {keys.job_state(self.job_name): state}
        puts.update(extra or {})
        ok = self.store.commit(
            puts,  # type: ignore[arg-type]
            expect_value=self.leader.guard,
            expect_revision={keys.job_state(self.job_name): revision},
        )
        if not ok:
            self.log.warning("state changed under us; re-reading")
        return ok

    # -- phases --------------------------------------------------------------------------------
    def _create(self, now: float) -> None:
        slots = [f"node-{i}" for i in range(len(slot_roles(self.job.spec)))]
        state = JobState(job=self.job_name, slots=slots, next_node_index=len(slots), created_at=now, updated_at=now)
        if self.store.commit({keys.job_state(self.job_name): state}, expect_value=self.leader.guard,
                             expect_revision={keys.job_state(self.job_name): 0}):  # fmt: skip
            self.log.info("job created", fields={"slots": slots})

    def _pending(self, state: JobState, revision: int, log: ContextLogger) -> None:
        if not self._ensure_nodes(state, revision):
            return
        registered = self._registrations()
        if all(s in registered for s in state.slots):
            if self.ft.preflight and not state.preflight_passed:
                self._preflight(state, revision, log)
                return
            self._start_generation(state, revision, log)
        elif time.monotonic() - self._pending_since > STARTUP_TIMEOUT_SECONDS:
            missing = [s for s in state.slots if s not in registered]
            self._fail(state, revision, "NodesNotReady", f"nodes never registered: {', '.join(missing)}")

    def _preflight(self, state: JobState, revision: int, log: ContextLogger) -> None:
        """Check every node before the job starts; evict the ones that fail, then check again.

        Evictions here are the infrastructure's fault: they do not count against maxRestarts.
        """
        procs = min(2, max(r.processes_per_node for r in self.job.spec.roles))
        log.info("pre-flight checks", fields={"nodes": state.slots, "round": state.preflight_rounds + 1})
        verdicts = self.cluster.preflight(list(state.slots), procs)
        state.preflight_rounds += 1
        failed = [v for v in verdicts if not v.passed]
        extra: dict[str, Incident | Assignment] = {}
        now = time.time()
        for v in failed:
            replacement = f"node-{state.next_node_index}"
            state.next_node_index += 1
            state.slots = [replacement if s == v.node else s for s in state.slots]
            incident = Incident(id=f"inc-pre{state.preflight_rounds}-{uuid.uuid4().hex[:6]}", job=self.job_name,
                                failure_class=FailureClass.PREFLIGHT_FAILED, generation=0, node=v.node,
                                evidence=v.reasons[:20], action=f"evict {v.node} before the start, replace with "
                                f"{replacement}", failed_at=now, detected_at=now)  # fmt: skip
            extra[keys.incident(self.job_name, incident.id)] = incident
            log.warning("pre-flight failed; evicting", fields={"node": v.node, "reasons": v.reasons[:3]})
        if not failed:
            state.preflight_passed = True
        elif state.preflight_rounds >= MAX_PREFLIGHT_ROUNDS:
            self._fail(state, revision, "PreflightFailed",
                       f"nodes kept failing pre-flight checks after {state.preflight_rounds} rounds")  # fmt: skip
            return
        self._commit(state, revision, extra)

    def _restarting(self, state: JobState, revision: int, log: ContextLogger) -> None:
        # Stop the old generation's workers on the healthy nodes (they may be stuck in a collective).
        for node in state.slots:
            self._command(node, state.generation, AgentAction.STOP)
        if not self._ensure_nodes(state, revision):
            return
        registered = self._registrations()
        if all(s in registered for s in state.slots):
            self._start_generation(state, revision, log)

    def _running(self, state: JobState, revision: int, log: ContextLogger) -> None:
        for node in state.slots:
            self._command(node, state.generation, AgentAction.RUN)
        registered, beats = self._read_nodes()
        workers = [w for n in state.slots if (b := beats.get(n)) and b.generation == state.generation
                   for w in b.workers]  # fmt: skip
        if self._track_progress(state, revision, workers, log):
            return  # it committed: the state's revision moved, so decide the rest on the next tick

        lost = [n for n in state.slots if n not in registered]
        crashed = sorted((w for w in workers if w.exit_code not in (None, 0)), key=lambda w: w.exited_at or 0)
        if crashed and not lost and self._silent_since(state, beats, crashed[0].exited_at or 0.0):
            # The peers of a dead machine crash on its closed sockets long before its lease lapses.
            # Judge a crash only once every node has been heard from since it; a node that stays
            # silent is a lost node, and that is the failure to handle.
            return
        if lost:
            node = lost[0]
            last = self._last_beats.get(node)
            failed_at = last.sent_at if last else time.time() - self.ft.lease_ttl_seconds
            self._on_failure(state, revision, workers, Failure(FailureClass.LOST_NODE, node, failed_at), log)
        elif crashed:
            w = crashed[0]
            node = next(n for n in state.slots if any(x.rank == w.rank for x in beats[n].workers))
            failure = Failure(FailureClass.WORKER_CRASH, node, w.exited_at or time.time(), w.rank, w.exit_code,
                              w.log_tail)  # fmt: skip
            self._on_failure(state, revision, workers, failure, log)
        elif len(workers) == self.job.spec.world_size and all(w.exit_code == 0 for w in workers):
            self._note_progress(state, workers, force=True)
            state.phase, state.finished_at = JobPhase.SUCCEEDED, time.time()
            state.reason, state.message = "Completed", f"all {len(workers)} workers exited 0"
            if self._commit(state, revision):
                log.info("job succeeded")

    def _track_progress(self, state: JobState, revision: int, workers: list[WorkerStatus], log: ContextLogger) -> bool:
        """Record the job's first step and close the open incident at the first step after recovery.
        True if it committed (the caller must then re-read before committing anything else)."""
        stepped = [w for w in workers if w.first_step_at is not None]
        if not stepped:
            return False
        changed = self._note_progress(state, workers)
        extra: dict[str, Incident | Assignment] = {}
        if state.first_step_at is None:
            state.first_step_at = min(w.first_step_at for w in stepped)  # type: ignore[type-var]
            changed = True
        if state.open_incident is not None:
            incident = self.store.get(keys.incident(self.job_name, state.open_incident), Incident)
            if incident is not None and incident.first_step_at is None:
                first = min(stepped, key=lambda w: w.first_step_at)  # type: ignore[arg-type,return-value]
                rank0 = next((w for w in stepped if w.rank == 0), first)
                incident.first_step_at = first.first_step_at
                incident.resumed_step = first.first_step
                incident.loss_after = rank0.first_loss
                extra[keys.incident(self.job_name, incident.id)] = incident
                log.info("recovered", fields={"incident": incident.id, "resumed_step": incident.resumed_step,
                                              "downtime": incident.downtime})  # fmt: skip
            state.open_incident = None
            changed = True
        if changed:
            self._commit(state, revision, extra)
        return changed

    def _note_progress(self, state: JobState, workers: list[WorkerStatus], force: bool = False) -> bool:
        """Copy step and loss into the job state now and then, so they outlive the heartbeats."""
        steps = [w.step for w in workers if w.step is not None]
        if not steps or (state.last_step == max(steps)):
            return False
        if not force and time.time() - state.updated_at < PROGRESS_PERSIST_SECONDS:
            return False
        rank0 = next((w for w in workers if w.rank == 0 and w.loss is not None), None)
        state.last_step = max(steps)
        state.last_loss = rank0.loss if rank0 else state.last_loss
        return True

    # -- failures ------------------------------------------------------------------------------
    def _on_failure(
        self, state: JobState, revision: int, workers: list[WorkerStatus], failure: Failure, log: ContextLogger
    ) -> None:
        now = time.time()
        steps = [w.step for w in workers if w.step is not None]
        step_times = [w.step_time for w in workers if w.step_time]
        rank0 = next((w for w in workers if w.rank == 0), None)
        incident = Incident(
            id=f"inc-{state.generation:04d}-{uuid.uuid4().hex[:6]}",
            job=self.job_name,
            failure_class=failure.failure_class,
            generation=state.generation,
            node=failure.node,
            rank=failure.rank,
            exit_code=failure.exit_code,
            evidence=failure.evidence or [],
            failed_at=failure.failed_at,
            detected_at=now,
            step_at_failure=max(steps) if steps else None,
            loss_before=rank0.loss if rank0 else None,
            mean_step_time=sum(step_times) / len(step_times) if step_times else None,
        )
        log = log.bind(incident=incident.id, node=failure.node, rank=failure.rank)
        if state.restarts >= self.job.spec.failure_policy.max_restarts:
            incident.action = "fail"
            self._fail(state, revision, "RestartBudgetExhausted",
                       f"{failure.failure_class.value} on {failure.node} after {state.restarts} restarts",
                       incident)  # fmt: skip
            log.error("restart budget exhausted; job failed")
            return
        if failure.failure_class is FailureClass.LOST_NODE:
            replacement = f"node-{state.next_node_index}"
            state.slots = [replacement if s == failure.node else s for s in state.slots]
            state.next_node_index += 1
            incident.action = f"replace {failure.node} with {replacement}, restart"
        self._note_progress(state, workers, force=True)
        state.phase = JobPhase.RESTARTING
        state.restarts += 1
        state.open_incident = incident.id
        if self._commit(state, revision, {keys.incident(self.job_name, incident.id): incident}):
            log.warning("failure detected", fields={"class": failure.failure_class.value, "action": incident.action,
                                                    "exit_code": failure.exit_code})  # fmt: skip

    def _fail(self, state: JobState, revision: int, reason: str, message: str, incident: Incident | None = None) -> None:
        state.phase, state.reason, state.message, state.finished_at = JobPhase.FAILED, reason, message, time.time()
        extra = {keys.incident(self.job_name, incident.id): incident} if incident else {}
        self._commit(state, revision, extra)  # type: ignore[arg-type]

    # -- generations and nodes -----------------------------------------------------------------
    def _start_generation(self, state: JobState, revision: int, log: ContextLogger) -> None:
        generation = state.generation + 1
        assignment = assign(self.job_name, self.job.spec, state.slots, generation,
                            self.cluster.rendezvous(state.slots[0]))  # fmt: skip
        now = time.time()
        extra: dict[str, Incident | Assignment] = {keys.generation(self.job_name, generation): assignment}
        if state.open_incident is not None:
            incident = self.store.get(keys.incident(self.job_name, state.open_incident), Incident)
            if incident is not None:
                incident.restarted_at = now
                extra[keys.incident(self.job_name, incident.id)] = incident
        state.generation, state.phase = generation, JobPhase.RUNNING
        state.started_at = state.started_at or now
        if self._commit(state, revision, extra):
            log.info("generation started", fields={"generation": generation, "slots": state.slots,
                                                   "master": f"{assignment.master_addr}:{assignment.master_port}"})  # fmt: skip
            for node in state.slots:
                self._command(node, generation, AgentAction.RUN)

    def _ensure_nodes(self, state: JobState, revision: int) -> bool:
        """Start slot nodes never started; stop nodes without a slot; give the slot of a node that
        died before (re)joining to a new node. True if the state is settled (nothing committed)."""
        known = {n.name: n for n in self.cluster.list_nodes()}
        registered = self._registrations()
        for name in known:
            if name not in state.slots:
                self.log.info("stopping node without a slot", fields={"node": name})
                self.cluster.stop_node(name)
        dead = [s for s in state.slots if s in known and not known[s].alive and s not in registered]
        if dead:
            for slot in dead:
                replacement = f"node-{state.next_node_index}"
                state.slots = [replacement if s == slot else s for s in state.slots]
                state.next_node_index += 1
                self.log.warning("node died before joining; replacing it", fields={"node": slot, "replacement": replacement})
            self._commit(state, revision)
            return False
        for slot in state.slots:
            if slot not in known:
                self.log.info("starting node", fields={"node": slot})
                self.cluster.start_node(slot)
        return True

    def _command(self, node: str, generation: int, action: AgentAction) -> None:
        key = keys.node_command(self.job_name, node)
        current = self.store.get(key, AgentCommand)
        if current is None or (current.generation, current.action) != (generation, action):
            self.store.put(key, AgentCommand(generation=generation, action=action, issued_at=time.time()))

    def _silent_since(self, state: JobState, beats: dict[str, Heartbeat], t: float) -> list[str]:
        """Slot nodes with no heartbeat sent after time `t`. Agents beat at once when a worker
        exits, and every interval otherwise, so a live node is heard from soon after any crash."""
        return [n for n in state.slots if (b := beats.get(n)) is None or b.sent_at < t]

    def _registrations(self) -> dict[str, NodeRegistration]:
        return read_nodes(self.store, self.job_name).registrations

    def _read_nodes(self) -> tuple[dict[str, NodeRegistration], dict[str, Heartbeat]]:
        """Registrations, and heartbeats including the last one of nodes whose lease lapsed."""
        nodes = read_nodes(self.store, self.job_name)
        self._last_beats.update(nodes.heartbeats)
        return nodes.registrations, dict(self._last_beats)

    def _finish(self, state: JobState) -> None:
        """Tell every agent the job is over, wait for them to go, then take their machines away."""
        for node in state.slots:
            self._command(node, state.generation, AgentAction.SHUTDOWN)
        deadline = time.monotonic() + SHUTDOWN_WAIT_SECONDS
        while time.monotonic() < deadline and any(n.alive for n in self.cluster.list_nodes()):
            time.sleep(0.2)
        for node in self.cluster.list_nodes():
            self.cluster.stop_node(node.name)
        self.log.info("job finished", fields={"phase": state.phase.value, "reason": state.reason})
