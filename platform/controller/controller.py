"""The job controller: a level-triggered state machine whose state lives in etcd.

Each tick reads the job's state and its nodes' heartbeats, decides, and commits the decision in
one guarded transaction (only while we are the leader and nobody changed the state under us).
Side effects on nodes (commands, starting and stopping machines) are derived from the committed
state and are idempotent, so a controller killed at any point is replaced by one that carries on
from etcd: it neither repeats a restart nor forgets an incident.

    Pending --all nodes registered, pre-flight passed--> Running
    Running --failure: classified, then the policy's rung (policy.decide)--> Restarting
    Restarting --workers stopped, stop-time checks passed, slots registered--> Running (generation + 1)
    Running --every worker exited 0--> Succeeded      any --budget spent / Fail rule--> Failed

Failures are handled by ByteRobust's ladder (stalwart.controller.policy): machine faults evict at
once; an evicted node's slot (and so its ranks) goes to a warm standby while the healthy nodes keep
their agents and restart only their workers; crashes are classified from the logs; hangs are
found by an adaptive timeout, then diagnosed from every rank's stack. Every eviction is committed
together with the slot change and the incident, so a controller killed mid-recovery never evicts
twice nor loses an incident.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import uuid

from stalwart.cluster import Cluster, NodeInfo
from stalwart.controller.diagnosis_link import (
    diagnose_crash,
    diagnose_hang,
    diagnose_slowdown,
    diagnosis_url,
)
from stalwart.controller.leader import Leadership
from stalwart.controller.policy import (
    MACHINE_CLASSES,
    Classified,
    Counters,
    NicHistory,
    classify_crash,
    count,
    decide,
    hang_timeout,
    is_loss_spike,
    machine_fault_suspects,
    slowdown_onset,
)
from stalwart.controller.ranks import assign, slot_roles
from stalwart.controller.replay_run import conclusion as replay_conclusion
from stalwart.controller.replay_run import judge, phase_assignment, replayable
from stalwart.controller.replay_run import plan as plan_replay_groups
from stalwart.controller.standby_pool import standbys_for
from stalwart.diagnosis.log_classify import SYMPTOMS
from stalwart.faults.spec import CONTROLLER_CRASH_ENV
from stalwart.logs import ContextLogger, get_logger
from stalwart.spec import TrainingJob, parse_job
from stalwart.spec.model import FailureAction, FailureEvent, RecoveryMode
from stalwart.store import keys
from stalwart.store.client import LeaseLost, Store
from stalwart.store.nodes import read_nodes
from stalwart.store.records import (
    AgentAction,
    AgentCommand,
    Assignment,
    Cordon,
    FailureClass,
    Heartbeat,
    Incident,
    JobPhase,
    JobState,
    NodeRegistration,
    OperatorRequest,
    RequestKind,
    RequestStatus,
    WorkerStatus,
)

TICK_SECONDS = 0.1
MAX_HURRIED_TICKS = 4  # ticks run back to back while each one commits a step of a recovery
STARTUP_TIMEOUT_SECONDS = 300.0
SHUTDOWN_WAIT_SECONDS = 30.0
PROGRESS_PERSIST_SECONDS = 5.0
MAX_PREFLIGHT_ROUNDS = 3
# After a crash, a node that misses this many heartbeats (and half its lease) while its peers report
# is fenced as lost.
MISSED_BEATS_AFTER_CRASH = 3
PEER_TROUBLE_SECONDS = 5.0  # how long a peer-loss symptom makes every tick ask the cluster for dead machines
GONE_PER_CLUSTER = "its machine is gone (the cluster reports it dead)"  # why a node was fenced at once
LOSS_HISTORY = 20
PACE_HISTORY = 200
PACE_QUIET_SECONDS = 10.0  # after slowdown rounds that blame no one; doubles each time
REPLAY_RECENT_SECONDS = 3600.0  # failures further apart than this do not add up towards a replay
Extra = dict[str, "Incident | Assignment | Cordon | OperatorRequest"]


class NotLeader(RuntimeError):
    pass


class JobController:
    def __init__(self, store: Store, cluster: Cluster, job_name: str, diagnosis_url: str | None = None) -> None:
        self.store = store
        self.cluster = cluster
        self.job_name = job_name
        self._spec_cache: tuple[bytes, TrainingJob] | None = None
        self.job: TrainingJob = self._read_spec()
        self.ft = self.job.spec.fault_tolerance
        self.policy = self.job.spec.failure_policy
        self.leader = Leadership(store, job_name, ttl=self.ft.lease_ttl_seconds)
        self.log: ContextLogger = get_logger("stalwart.controller", job=job_name)
        self._diagnosis_url = diagnosis_url
        # Last heartbeat seen per node: when a lease lapses its heartbeat key vanishes with it.
        self._last_beats: dict[str, Heartbeat] = {}
        self._pending_since = time.monotonic()
        self._nics: dict[str, NicHistory] = {}
        self._losses: list[float] = []
        # The generation's pace: (time, step time) once per step seen, and the step last sampled.
        self._pace: list[tuple[float, float]] = []
        self._paced_step: int | None = None
        self._pace_quiet_until, self._pace_backoff = 0.0, PACE_QUIET_SECONDS
        self._hang_second_look_at = 0.0  # a stall with no suspect is looked at twice before acting
        self._cordoned: set[str] = set()
        # Standbys that join after the pre-flight are checked on a thread; results land here.
        self._standby_checks: dict[str, tuple[bool, list[str]]] = {}
        self._checking: set[str] = set()
        self._pool_checked_at = 0.0  # the pool is looked after once per heartbeat interval
        self._stopping: dict[str, threading.Thread] = {}  # nodes being stopped, off the control loop
        self._fenced: dict[str, str] = {}  # node -> why this controller revoked its lease (the evidence)
        self._moved = False  # whether this tick committed: the run loop then skips its sleep

    def _read_spec(self) -> TrainingJob:
        """The job's spec as etcd holds it now; parsed only when it changed (it is read every tick
        to notice a new codeVersion)."""
        raw = self.store.get_raw(keys.job_spec(self.job_name))
        if raw is None:
            raise ValueError(f"job {self.job_name!r} not found in etcd ({keys.job_spec(self.job_name)})")
        if self._spec_cache is None or self._spec_cache[0] != raw:
            self._spec_cache = (raw, parse_job(json.loads(raw), keys.job_spec(self.job_name)))
        return self._spec_cache[1]

    # -- the loop ------------------------------------------------------------------------------
    def run(self, leader_timeout: float = 60.0) -> JobPhase:
        if not self.leader.acquire(timeout=leader_timeout):
            raise NotLeader(f"another controller holds {self.leader.key}")
        self.log.info("leading", fields={"identity": self.leader.identity})
        try:
            hurried = 0
            while True:
                self.leader.keep()
                self._moved = False
                self.tick()
                # Decide from what etcd holds, never from an object a failed commit left changed.
                state = self.store.get(keys.job_state(self.job_name), JobState)
                if state is not None and state.phase.terminal:
                    self._finish(state)
                    return state.phase
                # A tick that moved the state (a failure handled, a generation started) is followed
                # at once by the next step of the recovery, a few times in a row at most.
                hurried = hurried + 1 if self._moved and hurried < MAX_HURRIED_TICKS else 0
                if not hurried:
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
        if not state.phase.terminal and self._serve_requests(state, revision, log):
            return state
        handler = {
            JobPhase.PENDING: self._pending,
            JobPhase.RUNNING: self._running,
            JobPhase.RESTARTING: self._restarting,
        }.get(state.phase)
        if handler is not None:
            handler(state, revision, log)
        return state

    def _commit(
        self,
        state: JobState,
        revision: int,
        extra: Extra | None = None,
        deletes: list[str] | None = None,
        guard: dict[str, int] | None = None,
    ) -> bool:
        """One guarded transaction: we lead, the state is as we read it, and so is every key in
        `guard` (key -> mod revision), e.g. an operator request nobody withdrew meanwhile."""
        state.updated_at = time.time()
        puts: dict[str, object] = {keys.job_state(self.job_name): state}
        puts.update(extra or {})
        ok = self.store.commit(
            puts,  # type: ignore[arg-type]
            expect_value=self.leader.guard,
            expect_revision={keys.job_state(self.job_name): revision, **(guard or {})},
            deletes=deletes,
        )
        self._moved = self._moved or ok
        if not ok:
            self.log.warning("state changed under us; re-reading")
        return ok

    # -- phases --------------------------------------------------------------------------------
    def _create(self, now: float) -> None:
        count = len(slot_roles(self.job.spec))
        slots = [f"node-{i}" for i in range(count)]
        standbys = [f"node-{count + i}" for i in range(standbys_for(self.job.spec.standbys, count))]
        state = JobState(
            job=self.job_name,
            slots=slots,
            standbys=standbys,
            next_node_index=count + len(standbys),
            code_version=self.job.spec.code_version,
            created_at=now,
            updated_at=now,
        )
        if self.store.commit(
            {keys.job_state(self.job_name): state},
            expect_value=self.leader.guard,
            expect_revision={keys.job_state(self.job_name): 0},
        ):
            self.log.info("job created", fields={"slots": slots, "standbys": standbys})

    def _pending(self, state: JobState, revision: int, log: ContextLogger) -> None:
        if not self._ensure_nodes(state, revision):
            return
        registered = self._registrations()
        if all(s in registered for s in state.slots):
            if self.ft.preflight and not state.preflight_passed:
                # Standbys are checked with the job's nodes when they are up; late ones on their own.
                waiting = [s for s in state.standbys if s not in registered]
                if waiting and time.monotonic() - self._pending_since < STARTUP_TIMEOUT_SECONDS / 10:
                    return
                self._preflight(state, revision, log, [s for s in state.standbys if s in registered])
                return
            self._start_generation(state, revision, log)
        elif time.monotonic() - self._pending_since > STARTUP_TIMEOUT_SECONDS:
            missing = [s for s in state.slots if s not in registered]
            self._fail(state, revision, "NodesNotReady", f"nodes never registered: {', '.join(missing)}")

    def _preflight(self, state: JobState, revision: int, log: ContextLogger, standbys: list[str]) -> None:
        """Check every node before the job starts; evict the ones that fail, then check again.

        Evictions here are the infrastructure's fault: they do not count against maxRestarts.
        """
        nodes = list(state.slots) + standbys
        log.info("pre-flight checks", fields={"nodes": nodes, "round": state.preflight_rounds + 1})
        verdicts = self.cluster.preflight(nodes, self._check_procs())
        state.preflight_rounds += 1
        failed = [v for v in verdicts if not v.passed]
        extra: Extra = {}
        now = time.time()
        bad = {v.node for v in failed}
        state.standbys_checked = sorted(set(state.standbys_checked) | {n for n in standbys if n not in bad})
        for v in failed:
            incident = Incident(
                id=f"inc-pre{state.preflight_rounds}-{uuid.uuid4().hex[:6]}",
                job=self.job_name,
                failure_class=FailureClass.PREFLIGHT_FAILED,
                generation=0,
                node=v.node,
                suspects=[v.node],
                evidence=v.reasons[:20],
                counted=False,
                policy_action=FailureAction.EVICT,
                runbook="preflight_failed",
                failed_at=now,
                detected_at=now,
            )
            self._evict(state, [v.node], incident, extra, exclude=bad)
            incident.action = f"evict {v.node} before the start" + (
                f", replace with {incident.replacements[v.node]}" if v.node in incident.replacements else ""
            )
            extra[keys.incident(self.job_name, incident.id)] = incident
            log.warning("pre-flight failed; evicting", fields={"node": v.node, "reasons": v.reasons[:3]})
        passed = {v.node for v in verdicts if v.passed}
        if all(s in passed for s in state.slots):
            state.preflight_passed = True  # replacements, if any, were standbys that passed with them
        elif state.preflight_rounds >= MAX_PREFLIGHT_ROUNDS:
            self._fail(
                state,
                revision,
                "PreflightFailed",
                f"nodes kept failing pre-flight checks after {state.preflight_rounds} rounds",
            )
            return
        self._commit(state, revision, extra)

    def _restarting(self, state: JobState, revision: int, log: ContextLogger) -> None:
        if state.replay is not None and state.replay.generation is not None:
            self._replaying(state, revision, log)
            return
        # Stop the old generation's workers on the healthy nodes (they may be stuck in a collective).
        for node in state.slots:
            self._command(node, state.generation, AgentAction.STOP)
        if not self._ensure_nodes(state, revision):
            return
        registered, beats = self._read_nodes()
        if not all(s in registered for s in state.slots):
            return
        if state.checks_pending:
            still = [
                n
                for n in state.slots
                if (b := beats.get(n)) is not None and any(w.exit_code is None for w in b.workers)
            ]
            if still:
                return  # the checks need the machines to themselves
            self._stop_time_checks(state, revision, log)
            return
        if state.replay is not None:
            self._start_replay_phase(state, revision, log)
            return
        self._start_generation(state, revision, log)

    def _stop_time_checks(self, state: JobState, revision: int, log: ContextLogger) -> None:
        """Collective and compute checks on the job's nodes after a fault with no machine named:
        evict what fails (standbys step in); if all pass, the fault was transient."""
        log.info("stop-time checks", fields={"nodes": state.slots})
        verdicts = self.cluster.preflight(list(state.slots), self._check_procs())
        failed = [v for v in verdicts if not v.passed]
        extra: Extra = {}
        if failed and state.open_incident is not None:
            incident = self.store.get(keys.incident(self.job_name, state.open_incident), Incident)
            if incident is not None:
                incident.evidence += [f"stop-time check failed on {v.node}: {'; '.join(v.reasons[:3])}" for v in failed]
                incident.suspects = sorted(set(incident.suspects) | {v.node for v in failed})
                self._evict(state, [v.node for v in failed], incident, extra)
                incident.action += f"; stop-time checks evicted {', '.join(v.node for v in failed)}"
                extra[keys.incident(self.job_name, incident.id)] = incident
        state.checks_pending = False
        self._count_unexplained(state, bool(failed), log)
        if self._commit(state, revision, extra):
            log.info("stop-time checks done", fields={"failed": [v.node for v in failed]})

    # -- dual-phase replay (rung 6) ------------------------------------------------------------
    def _count_unexplained(self, state: JobState, explained: bool, log: ContextLogger) -> None:
        """A failure the checks cannot explain counts towards a replay; one that recurs within the
        hour counts on top of the last (a job that ran well for longer starts the count again)."""
        if explained:
            state.unexplained_failures = 0
            return
        ran = time.time() - (state.generation_started_at or time.time())
        state.unexplained_failures = 1 if ran > REPLAY_RECENT_SECONDS else state.unexplained_failures + 1
        if not self.policy.replay_after or state.unexplained_failures < self.policy.replay_after:
            return
        why_not = replayable(self.job.spec, state.slots)
        if why_not:
            log.warning(
                "failures keep coming with nothing to blame, and the job cannot be replayed", fields={"why": why_not}
            )
            return
        state.replay = plan_replay_groups(state.slots)
        log.warning(
            "failures keep coming with nothing to blame; dual-phase replay",
            fields={"failures": state.unexplained_failures, "vertical": [g.nodes for g in state.replay.vertical]},
        )

    def _start_replay_phase(self, state: JobState, revision: int, log: ContextLogger) -> None:
        """Run the current phase's groups, each a small copy of the job, as one generation."""
        assert state.replay is not None
        pending = [g for g in state.replay.groups() if g.outcome is None]
        generation = state.generation + 1
        assignment = phase_assignment(self.job_name, self.job.spec, pending, generation, self.cluster.rendezvous)
        assignment.replay_steps = self.policy.replay_steps
        state.generation = generation
        state.replay.generation, state.replay.started_at = generation, time.time()
        if self._commit(state, revision, {keys.generation(self.job_name, generation): assignment}):
            log.info(
                "replay phase started",
                fields={
                    "replay_phase": state.replay.phase,
                    "generation": generation,
                    "groups": {g.id: g.nodes for g in pending},
                },
            )
            for group in pending:
                for node in group.nodes:
                    self._command(node, generation, AgentAction.RUN)

    def _replaying(self, state: JobState, revision: int, log: ContextLogger) -> None:
        """Judge the running phase's groups; when all are judged, go on to the next phase, or read
        the faulty node off the failing groups and evict it (a standby steps in)."""
        replay = state.replay
        assert replay is not None and replay.generation is not None
        registered, beats = self._read_nodes()
        procs = self.job.spec.roles[0].processes_per_node
        now, changed = time.time(), False
        for group in replay.groups():
            if group.outcome is not None:
                continue
            verdict = judge(
                group,
                beats,
                set(registered),
                replay.generation,
                procs,
                replay.started_at or now,
                self.ft.first_step_timeout_seconds,
                now,
            )
            if verdict is not None:
                group.outcome, group.reason = verdict  # type: ignore[assignment]
                changed = True
                log.info(
                    "replay group judged",
                    fields={"group": group.id, "nodes": group.nodes, "outcome": group.outcome, "why": group.reason},
                )
        if any(g.outcome is None for g in replay.groups()):
            if changed:
                self._commit(state, revision)
            return
        replay.generation = None  # the next tick stops what is left of this phase's workers
        if replay.phase == "horizontal":
            replay.phase = "vertical"
            self._commit(state, revision)
            return
        node, summary = replay_conclusion(replay)
        state.replay, state.unexplained_failures = None, 0
        extra: Extra = {}
        incident = (
            self.store.get(keys.incident(self.job_name, state.open_incident), Incident) if state.open_incident else None
        )
        if incident is not None:
            incident.evidence += [summary] + [
                f"{g.id} {g.nodes}: {g.outcome}, {g.reason}" for g in [*replay.horizontal, *replay.vertical]
            ]
            if node is not None:
                incident.suspects = sorted(set(incident.suspects) | {node})
                self._evict(state, [node], incident, extra)
                incident.action += f"; dual-phase replay found {node}, evicted"
            else:
                incident.action += "; dual-phase replay inconclusive, restarting"
            extra[keys.incident(self.job_name, incident.id)] = incident
        if self._commit(state, revision, extra):
            log.warning("replay done", fields={"found": node, "summary": summary})

    def _running(self, state: JobState, revision: int, log: ContextLogger) -> None:
        for node in state.slots:
            self._command(node, state.generation, AgentAction.RUN)
        registered, beats = self._read_nodes()
        workers = [
            w for n in state.slots if (b := beats.get(n)) and b.generation == state.generation for w in b.workers
        ]
        if self._track_progress(state, revision, workers, log):
            return  # it committed: the state's revision moved, so decide the rest on the next tick
        # A rank that just lost a peer's connection is the first sign of a dead machine, often a few
        # hundred ms before any worker exits: ask the cluster now, not at the next pool check.
        if self._peer_trouble(workers, time.time()):
            self._fence_dead_slots(state, registered, log)
        # Looking after the pool lists the cluster's nodes (a pod listing on Kubernetes): not every tick.
        if time.monotonic() - self._pool_checked_at >= self.ft.heartbeat_interval_seconds:
            self._pool_checked_at = time.monotonic()
            if self._maintain_pool(state, revision, registered, beats, log):
                return
        if self._code_update_due(state, revision, log):
            return
        now = time.time()

        # Rung 1: machine signals from the probes evict at once, no diagnosis.
        faults = {n: b.machine_faults for n, b in beats.items() if n in state.slots and n in registered}
        condemned = machine_fault_suspects(
            faults, self._nics, now, nic_count=self.ft.nic_flap_count, nic_window=self.ft.nic_flap_window_seconds
        )
        if condemned:
            evidence = [f"{n}: {line}" for n, lines in sorted(condemned.items()) for line in lines]
            self._handle(
                state, revision, workers, Classified(FailureEvent.MACHINE_FAULT, sorted(condemned), evidence), now, log
            )
            return

        lost = [n for n in state.slots if n not in registered]
        crashed = sorted((w for w in workers if w.exit_code not in (None, 0)), key=lambda w: w.exited_at or 0)
        if crashed and not lost and (silent := self._silent_since(state, beats, crashed[0].exited_at or 0.0)):
            # The peers of a dead machine crash on its closed sockets long before its lease lapses.
            # Judge a crash only once every node has been heard from since it; a node that stays
            # silent is a lost node, and that is the failure to handle. Its peers just lost their
            # connections to it, so a few missed heartbeats are evidence enough: fence it (revoke
            # its lease) rather than wait out the TTL.
            # Sooner still if the cluster already knows its machine is gone (the process exited, the
            # pod failed): that is certain, and asking costs one listing per tick while this lasts.
            patience = max(MISSED_BEATS_AFTER_CRASH * self.ft.heartbeat_interval_seconds, self.ft.lease_ttl_seconds / 2)
            gone = self._gone_per_cluster(silent)
            if not gone and now - (crashed[0].exited_at or now) <= patience:
                return
            why = GONE_PER_CLUSTER if gone else f"silent for {patience:g}s since its peers crashed"
            self._fence(gone or silent, registered, why, log)
            lost = [n for n in state.slots if n not in registered]
        if lost:
            last = [self._last_beats[n].sent_at for n in lost if n in self._last_beats]
            failed_at = min(last) if last else now - self.ft.lease_ttl_seconds
            evidence = [
                f"{n}: " + self._fenced.pop(n, f"node lease lapsed (no heartbeat for {self.ft.lease_ttl_seconds}s)")
                for n in lost
            ]
            self._handle(state, revision, workers, Classified(FailureEvent.LOST_NODE, lost, evidence), failed_at, log)
        elif crashed:
            owner = {w.rank: n for n in state.slots if (b := beats.get(n)) for w in b.workers}
            pairs = [(owner[w.rank], w) for w in crashed if w.rank in owner]
            classified = classify_crash(pairs)
            self._refine_crash(state, pairs, classified, log)
            self._handle(state, revision, workers, classified, crashed[0].exited_at or now, log)
        elif len(workers) == self.job.spec.world_size and all(w.exit_code == 0 for w in workers):
            self._note_progress(state, workers, force=True)
            state.phase, state.finished_at = JobPhase.SUCCEEDED, time.time()
            state.reason, state.message = "Completed", f"all {len(workers)} workers exited 0"
            if self._commit(state, revision):
                log.info("job succeeded")
        else:
            self._watch_progress(state, revision, workers, now, log)

    def _refine_crash(
        self, state: JobState, pairs: list[tuple[str, WorkerStatus]], classified: Classified, log: ContextLogger
    ) -> None:
        """Ask diagnosis to read the crash logs too; its verdict rides in the incident, and a machine
        it names (a signature the agent's scan missed) upgrades a plain crash to a machine fault."""
        assignment = self.store.get(keys.generation(self.job_name, state.generation), Assignment)
        if assignment is None:
            return
        finding = diagnose_crash(self.job_name, assignment, pairs, self._url(), log)
        if finding is None:
            return
        classified.verdict = finding.verdict
        verdict_class = (finding.verdict or {}).get("failure_class")
        # Only a machine signature upgrades a crash to an eviction; a bare "it died first" does not
        # (the OOM killer looks the same): the stop-time checks decide those.
        if classified.event is FailureEvent.WORKER_CRASH and verdict_class in MACHINE_CLASSES and finding.suspects:
            classified.event, classified.suspects = FailureEvent.MACHINE_FAULT, finding.suspects
            classified.runbook = finding.runbook or "machine_fault"
            classified.evidence += finding.evidence

    def _watch_progress(
        self, state: JobState, revision: int, workers: list[WorkerStatus], now: float, log: ContextLogger
    ) -> None:
        """Rungs 3-4 for a job that is running: loss spikes, and hangs past the adaptive timeout."""
        rank0 = next((w for w in workers if w.rank == 0), None)
        if rank0 is not None and rank0.loss is not None and rank0.step is not None:
            recent = self._losses[-LOSS_HISTORY:]
            if is_loss_spike(rank0.loss, recent, self.ft.loss_spike_factor):
                evidence = [f"loss {rank0.loss:.4g} at step {rank0.step}, recent mean {sum(recent) / len(recent):.4g}"]
                self._handle(state, revision, workers, Classified(FailureEvent.LOSS_SPIKE, [], evidence), now, log)
                return
            if not self._losses or self._losses[-1] != rank0.loss:
                self._losses.append(rank0.loss)
        running = [w for w in workers if w.exit_code is None]
        if not running:
            return
        progress = [w.last_progress_at for w in running if w.last_progress_at is not None]
        if progress:
            timeout = hang_timeout(
                [w.step_time for w in running if w.step_time],
                self.ft.hang_timeout_multiplier,
                self.ft.hang_timeout_floor_seconds,
            )
            since = max(progress)
        else:
            timeout = self.ft.first_step_timeout_seconds
            since = state.generation_started_at or state.updated_at
        if now - since <= timeout or now < self._hang_second_look_at:
            self._watch_pace(state, revision, workers, running, now, log)
            return
        assignment = self.store.get(keys.generation(self.job_name, state.generation), Assignment)
        if assignment is None:
            return
        log.warning(
            "no progress; capturing stacks", fields={"stalled_for": round(now - since, 1), "timeout": round(timeout, 1)}
        )
        detected = time.time()
        try:
            finding = diagnose_hang(self.store, self.job_name, assignment, self._url(), log)
        except ImportError:
            finding = None
        if (finding is None or not finding.suspects) and self._hang_second_look_at == 0.0:
            # No suspect (stacks unusable, or the workers are finishing): look again after another
            # timeout before restarting anything.
            self._hang_second_look_at = time.time() + timeout
            log.warning(
                "no suspect for the stall; looking again before acting",
                fields={"evidence": (finding.evidence if finding else [])[:2]},
            )
            return
        self._hang_second_look_at = 0.0
        classified = Classified(
            FailureEvent.HANG,
            finding.suspects if finding else [],
            [f"no progress for {now - since:.1f}s (timeout {timeout:.1f}s)"] + (finding.evidence if finding else []),
            runbook=(finding.runbook if finding else None) or "hang",
        )
        classified.verdict = finding.verdict if finding else None
        classified.diagnosed_at = time.time()
        # Re-read: the capture took seconds, and a commit needs the state's current revision.
        current, revision = self.store.get_with_revision(keys.job_state(self.job_name), JobState)
        if current is None or current.phase is not JobPhase.RUNNING:
            return
        self._handle(current, revision, workers, classified, since, log, detected_at=detected)

    def _watch_pace(
        self,
        state: JobState,
        revision: int,
        workers: list[WorkerStatus],
        running: list[WorkerStatus],
        now: float,
        log: ContextLogger,
    ) -> None:
        """Rung 4's slowdowns: a job stepping `slowdownFactor` times slower than its own baseline gets
        rounds of stacks; the node they keep pointing at is evicted. In synchronous training every
        rank reports the same step time, so the pace tells that someone is slow, the stacks who."""
        steps = [w.step for w in running if w.step is not None]
        times = sorted(w.step_time for w in running if w.step_time)
        if not steps or not times or max(steps) == self._paced_step or now < self._pace_quiet_until:
            return  # (nothing sampled while quiet, so a pause cannot turn into the baseline)
        self._paced_step = max(steps)
        self._pace = [*self._pace[-PACE_HISTORY + 1 :], (now, times[len(times) // 2])]
        onset = slowdown_onset(self._pace, self.ft.slowdown_factor)
        if onset is None:
            return
        assignment = self.store.get(keys.generation(self.job_name, state.generation), Assignment)
        if assignment is None:
            return
        recent = self._pace[-1][1]
        log.warning(
            "slowdown; capturing rounds of stacks",
            fields={"step_time": round(recent, 3), "rounds": self.ft.slowdown_rounds},
        )
        detected = time.time()
        try:
            finding = diagnose_slowdown(
                self.store,
                self.job_name,
                assignment,
                self._url(),
                log,
                rounds=self.ft.slowdown_rounds,
                interval=max(0.5, 1.5 * recent),
            )
        except ImportError:
            finding = None
        if finding is None or not finding.suspects:
            # Everyone slowed down together (a noisy neighbour, a shared filesystem, a data change):
            # forget the slow samples but keep the baseline, and look again only after a pause that
            # doubles each time. A slowdown that lasts becomes the baseline by itself.
            self._pace = [p for p in self._pace if p[0] < onset]
            self._pace_quiet_until, self._pace_backoff = time.time() + self._pace_backoff, 2 * self._pace_backoff
            log.warning(
                "slowdown with no culprit; watching", fields={"evidence": (finding.evidence if finding else [])[:2]}
            )
            return
        self._pace, self._paced_step = [], None  # handled (or tolerated by an Ignore rule): a new baseline
        classified = Classified(
            FailureEvent.SLOWDOWN,
            finding.suspects,
            [f"step time {recent:.3g}s, more than {self.ft.slowdown_factor:g}x this generation's baseline"]
            + finding.evidence,
            runbook=finding.runbook or "slowdown",
        )
        classified.verdict, classified.diagnosed_at = finding.verdict, time.time()
        current, revision = self.store.get_with_revision(keys.job_state(self.job_name), JobState)
        if current is None or current.phase is not JobPhase.RUNNING:
            return
        self._handle(current, revision, workers, classified, onset, log, detected_at=detected)

    # -- progress ------------------------------------------------------------------------------
    def _track_progress(self, state: JobState, revision: int, workers: list[WorkerStatus], log: ContextLogger) -> bool:
        """Record the job's first step and close the open incident at the first step after recovery.
        True if it committed (the caller must then re-read before committing anything else)."""
        stepped = [w for w in workers if w.first_step_at is not None]
        if not stepped:
            return False
        changed = self._note_progress(state, workers)
        extra: Extra = {}
        if state.first_step_at is None:
            state.first_step_at = min(w.first_step_at for w in stepped)  # type: ignore[type-var]
            changed = True
        if state.resume_max_step is not None and any(
            (w.last_checkpoint_step or 0) > state.resume_max_step for w in workers
        ):
            state.resume_max_step = None  # a checkpoint newer than the rollback point exists: it is good
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
                log.info(
                    "recovered",
                    fields={
                        "incident": incident.id,
                        "resumed_step": incident.resumed_step,
                        "downtime": incident.downtime,
                    },
                )
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
        state.last_loss = rank0.loss if rank0 and math.isfinite(rank0.loss) else state.last_loss  # type: ignore[arg-type]
        return True

    # -- failures ------------------------------------------------------------------------------
    def _handle(
        self,
        state: JobState,
        revision: int,
        workers: list[WorkerStatus],
        classified: Classified,
        failed_at: float,
        log: ContextLogger,
        detected_at: float | None = None,
    ) -> None:
        """Take the policy's rung for a classified failure, in one guarded commit with its incident."""
        now = time.time()
        decision = decide(
            classified,
            self.policy,
            Counters(state.restarts, state.user_code_failures),
            checks_enabled=self.ft.stop_time_checks,
        )
        steps = [w.step for w in workers if w.step is not None]
        step_times = [w.step_time for w in workers if w.step_time]
        rank0 = next((w for w in workers if w.rank == 0), None)
        incident = Incident(
            id=f"inc-{state.generation:04d}-{uuid.uuid4().hex[:6]}",
            job=self.job_name,
            failure_class=classified.event,
            generation=state.generation,
            node=classified.suspects[0] if classified.suspects else None,
            rank=classified.rank,
            exit_code=classified.exit_code,
            evidence=classified.evidence[:60],
            suspects=classified.suspects,
            policy_action=decision.action,
            counted=decision.counted,
            verdict=classified.verdict,
            runbook=classified.runbook,
            failed_at=failed_at,
            detected_at=detected_at or now,
            diagnosed_at=classified.diagnosed_at,
            step_at_failure=max(steps) if steps else None,
            loss_before=rank0.loss if rank0 and rank0.loss is not None and math.isfinite(rank0.loss) else None,
            mean_step_time=sum(step_times) / len(step_times) if step_times else None,
        )
        if incident.node is None and classified.rank is not None:
            incident.node = next(
                (
                    n
                    for n in state.slots
                    if (b := self._last_beats.get(n)) and any(w.rank == classified.rank for w in b.workers)
                ),
                None,
            )
        log = log.bind(incident=incident.id, event=classified.event.value, action=decision.action.value)
        extra: Extra = {keys.incident(self.job_name, incident.id): incident}
        if decision.action is FailureAction.FAIL:
            incident.action = f"fail the job: {decision.reason}"
            message = decision.message
            if classified.event is FailureEvent.USER_CODE_ERROR:
                tail = [ln for ln in classified.evidence if ln.strip()][-12:]
                message = f"{decision.message}\n" + "\n".join(tail)
            self._fail(state, revision, decision.reason or classified.event.value, message, incident)
            log.error("job failed", fields={"reason": decision.reason})
            return
        if decision.action is FailureAction.IGNORE:
            incident.action = "ignored (failure policy)"
            incident.first_step_at = now
            if self._commit(state, revision, extra):
                log.warning("failure ignored by policy")
            return
        actions = []
        if decision.action is FailureAction.EVICT:
            self._evict(state, decision.suspects, incident, extra)
            actions.append("evict " + ", ".join(f"{s} (standby {r})" for s, r in incident.replacements.items()))
        if decision.action is FailureAction.ROLLBACK:
            # Skip the newest checkpoints: the fault may have been brewing before it surfaced. The
            # newest is the last interval boundary before the failure (or a later one a worker
            # reported, if the job saves off-interval).
            interval = self.job.spec.checkpoint.interval_steps
            newest = max(
                [
                    (incident.step_at_failure or 0) // interval * interval,
                    *(w.last_checkpoint_step or 0 for w in workers),
                ]
            )
            state.resume_max_step = max(0, newest - self.policy.rollback_checkpoints * interval)
            actions.append(f"roll back to a checkpoint at or before step {state.resume_max_step}")
        if decision.stop_time_checks:
            state.checks_pending = True
            actions.append("run stop-time checks")
        if self.policy.recovery is RecoveryMode.REQUEUE:
            # The baseline: every node relaunched from scratch (fresh agents, cold workers).
            fresh = [f"node-{state.next_node_index + i}" for i in range(len(state.slots))]
            state.next_node_index += len(fresh)
            state.slots = fresh
            actions.append("requeue: relaunch every node")
        else:
            actions.append("restart the workers in place")
        incident.action = "; ".join(actions)
        counters = count(Counters(state.restarts, state.user_code_failures), decision)
        state.restarts, state.user_code_failures = counters.restarts, counters.user_code_failures
        state.infra_restarts += 0 if decision.counted else 1
        self._note_progress(state, workers, force=True)
        state.phase = JobPhase.RESTARTING
        state.open_incident = incident.id
        if self._commit(state, revision, extra):
            log.warning(
                "failure handled",
                fields={"suspects": classified.suspects, "action": incident.action, "exit_code": classified.exit_code},
            )
            if incident.evicted and os.environ.get(CONTROLLER_CRASH_ENV) == "after-evict":
                log.warning("fault injection: controller dies right after committing an eviction")
                os._exit(17)

    def _evict(
        self, state: JobState, nodes: list[str], incident: Incident, extra: Extra, exclude: set[str] | None = None
    ) -> None:
        """Hot-swap: each evicted node's slot (and so its ranks) goes to a standby, the readiest
        first, or to a new node when the pool is empty. The node is cordoned in the same commit."""
        now = time.time()
        registered = self._registrations()
        for node in nodes:
            if node in state.evicted:
                continue
            state.evicted.append(node)
            cordon = Cordon(
                node=node,
                reason=f"{incident.failure_class.value}: {'; '.join(incident.evidence[:1])}"[:300],
                incident=incident.id,
                cordoned_at=now,
            )
            extra[keys.cordon(node)] = cordon
            if node in state.standbys:
                state.standbys.remove(node)
                continue
            if node not in state.slots:
                continue
            ready = sorted(
                (s for s in state.standbys if s not in (exclude or set()) and s not in nodes),
                key=lambda s: (s not in state.standbys_checked, s not in registered),
            )
            if ready:
                replacement = ready[0]
                state.standbys.remove(replacement)
            else:
                replacement = f"node-{state.next_node_index}"
                state.next_node_index += 1
            state.slots = [replacement if s == node else s for s in state.slots]
            incident.replacements[node] = replacement
            incident.evicted.append(node)
        # Replenish the pool at once: new standbys start while the job restarts.
        self._top_up_standbys(state)

    def _top_up_standbys(self, state: JobState) -> bool:
        target = standbys_for(self.job.spec.standbys, len(state.slots))
        added = False
        while len(state.standbys) < target:
            state.standbys.append(f"node-{state.next_node_index}")
            state.next_node_index += 1
            added = True
        return added

    def _fail(
        self, state: JobState, revision: int, reason: str, message: str, incident: Incident | None = None
    ) -> None:
        state.phase, state.reason, state.message, state.finished_at = JobPhase.FAILED, reason, message, time.time()
        extra: Extra = {keys.incident(self.job_name, incident.id): incident} if incident else {}
        self._commit(state, revision, extra)

    # -- standbys ------------------------------------------------------------------------------
    def _maintain_pool(
        self,
        state: JobState,
        revision: int,
        registered: dict[str, NodeRegistration],
        beats: dict[str, Heartbeat],
        log: ContextLogger,
    ) -> bool:
        """Keep the pool at its target: drop dead or faulty standbys, add new ones, check newcomers
        on a thread. True if it committed."""
        known = {n.name: n for n in self.cluster.list_nodes()}
        self._fence_dead_slots(state, registered, log, known)
        drop = {s: "died" for s in state.standbys if s in known and not known[s].alive and s not in registered}
        drop.update(
            {
                s: "; ".join(beats[s].machine_faults[:2])
                for s in state.standbys
                if s in registered and s in beats and beats[s].machine_faults
            }
        )
        drop.update(
            {
                s: "; ".join(self._standby_checks[s][1][:2]) or "failed its check"
                for s in state.standbys
                if s in self._standby_checks and not self._standby_checks[s][0]
            }
        )
        passed = [
            s
            for s in state.standbys
            if s in self._standby_checks and self._standby_checks[s][0] and s not in state.standbys_checked
        ]
        changed = bool(passed)
        state.standbys_checked = sorted(set(state.standbys_checked) | set(passed))
        extra: Extra = {}
        for s, why in drop.items():
            state.standbys.remove(s)
            state.evicted.append(s)
            extra[keys.cordon(s)] = Cordon(node=s, reason=f"standby {why}"[:300], cordoned_at=time.time())
            log.warning("dropping a standby", fields={"node": s, "why": why})
            changed = True
        changed |= self._top_up_standbys(state)
        if changed:
            self._commit(state, revision, extra)
            return True
        if state.open_incident is None:  # the pool is replenished once the recovery is over
            for s in state.standbys:
                if s not in known:
                    log.info("starting node", fields={"node": s, "standby": True})
                    self.cluster.start_node(s)
        for s in state.standbys:
            if s in registered and s not in state.standbys_checked and s not in self._checking and self.ft.preflight:
                self._checking.add(s)
                threading.Thread(target=self._check_standby, args=(s,), name=f"check-{s}", daemon=True).start()
        return False

    def _check_standby(self, node: str) -> None:
        try:
            verdict = self.cluster.preflight([node], self._check_procs())[0]
            self._standby_checks[node] = (verdict.passed, verdict.reasons)
        except Exception as exc:
            self._standby_checks[node] = (False, [f"check could not run: {exc}"])

    def _check_procs(self) -> int:
        return min(2, max(r.processes_per_node for r in self.job.spec.roles))

    # -- operator requests ---------------------------------------------------------------------
    def _serve_requests(self, state: JobState, revision: int, log: ContextLogger) -> bool:
        """Carry out the oldest pending request (evict, cordon, uncordon, check). True if it
        committed: the tick then stops, like after any commit."""
        pending = [
            r
            for r in self.store.get_prefix(keys.requests_prefix(self.job_name), OperatorRequest)
            if r.status is RequestStatus.PENDING
        ]
        if not pending:
            return False
        oldest = min(pending, key=lambda r: r.requested_at)
        request, request_revision = self.store.get_with_revision(
            keys.request(self.job_name, oldest.id), OperatorRequest
        )
        if request is None or request.status is not RequestStatus.PENDING:
            return False  # withdrawn or done since the listing
        guard = {keys.request(self.job_name, request.id): request_revision}
        log = log.bind(request=request.id, kind=request.kind.value, node=request.node)
        request.finished_at = time.time()
        extra: Extra = {keys.request(self.job_name, request.id): request}
        deletes: list[str] = []
        known = set(state.slots) | set(state.standbys)
        names_a_node = request.kind is not RequestKind.CHECK or request.node is not None
        if names_a_node and (
            request.node is None or (request.node not in known and request.kind is not RequestKind.UNCORDON)
        ):
            request.status, request.message = (
                RequestStatus.FAILED,
                (
                    f"node {request.node!r} is not part of job {self.job_name} "
                    f"(nodes: {', '.join(state.slots)}; standbys: {', '.join(state.standbys) or 'none'})"
                ),
            )
            return self._commit(state, revision, extra, guard=guard)
        node = request.node  # every kind but CHECK names one (refused above otherwise)
        if request.kind is RequestKind.EVICT and node is not None:
            if state.phase is not JobPhase.RUNNING and node in state.slots:
                return False  # evict between recoveries, not in the middle of one
            now = time.time()
            incident = Incident(
                id=f"inc-{state.generation:04d}-{uuid.uuid4().hex[:6]}",
                job=self.job_name,
                failure_class=FailureEvent.MACHINE_FAULT,
                generation=state.generation,
                node=node,
                suspects=[node],
                evidence=[f"evicted by {request.requested_by or 'an operator'}: {request.reason}"],
                policy_action=FailureAction.EVICT,
                counted=False,
                runbook="machine_fault",
                failed_at=now,
                detected_at=now,
            )
            self._evict(state, [node], incident, extra)
            incident.action = f"evict {node} on request" + (
                f", standby {incident.replacements[node]} takes its ranks" if node in incident.replacements else ""
            )
            extra[keys.incident(self.job_name, incident.id)] = incident
            if node in incident.replacements:
                state.phase, state.open_incident = JobPhase.RESTARTING, incident.id
                state.infra_restarts += 1
            else:
                incident.first_step_at = now  # a standby left the pool: no downtime
            request.status, request.message = RequestStatus.DONE, incident.action
            request.result = {"incident": incident.id, "replacements": incident.replacements}
        elif request.kind is RequestKind.CORDON and node is not None:
            extra[keys.cordon(node)] = Cordon(
                node=node,
                reason=request.reason or "cordoned by hand",
                cordoned_at=time.time(),
                by=request.requested_by or "cli",
            )
            if node in state.standbys:
                state.standbys.remove(node)
                state.evicted.append(node)
                self._top_up_standbys(state)
            request.status, request.message = (
                RequestStatus.DONE,
                f"{node} cordoned" + ("; it keeps running its ranks until evicted" if node in state.slots else ""),
            )
        elif request.kind is RequestKind.UNCORDON and node is not None:
            deletes.append(keys.cordon(node))
            self.cluster.uncordon(node)
            self._cordoned.discard(node)
            request.status, request.message = RequestStatus.DONE, f"{node} uncordoned"
        elif request.kind is RequestKind.CHECK:
            nodes = [request.node] if request.node else list(state.slots)
            log.info("checks on request", fields={"nodes": nodes})
            verdicts = self.cluster.preflight(nodes, self._check_procs())
            failed = [v.node for v in verdicts if not v.passed]
            request.status = RequestStatus.DONE
            request.message = f"{len(nodes) - len(failed)}/{len(nodes)} nodes passed" + (
                f"; failed: {', '.join(failed)}" if failed else ""
            )
            request.result = {v.node: {"passed": v.passed, "reasons": v.reasons[:10]} for v in verdicts}
        if self._commit(state, revision, extra, deletes, guard=guard):
            log.info("request done", fields={"status": request.status.value, "message": request.message})
        return True

    # -- code updates ----------------------------------------------------------------------------
    def _code_update_due(self, state: JobState, revision: int, log: ContextLogger) -> bool:
        """Lazy hot update: a new codeVersion is applied at the next restart, or forced once the
        spec's deadline passes. True if it committed."""
        try:
            latest = self._read_spec()
        except Exception:
            return False
        if latest.spec.code_version == state.code_version:
            return False
        if state.code_update_seen_at is None:
            state.code_update_seen_at = time.time()
            log.info(
                "new code version; applying at the next restart",
                fields={"from": state.code_version, "to": latest.spec.code_version},
            )
            return self._commit(state, revision)
        deadline = latest.spec.hot_update_deadline_seconds
        if deadline is None or time.time() - state.code_update_seen_at < deadline:
            return False
        evidence = [
            f"codeVersion {state.code_version} -> {latest.spec.code_version}: deadline of {deadline:.0f}s passed"
        ]
        self._handle(state, revision, [], Classified(FailureEvent.CODE_UPDATE, [], evidence), time.time(), log)
        return True

    # -- generations and nodes -----------------------------------------------------------------
    def _start_generation(self, state: JobState, revision: int, log: ContextLogger) -> None:
        if state.code_update_seen_at is not None:
            self.job = self._read_spec()  # the lazy hot update takes effect now
            self.ft, self.policy = self.job.spec.fault_tolerance, self.job.spec.failure_policy
            state.code_version, state.code_update_seen_at = self.job.spec.code_version, None
        generation = state.generation + 1
        assignment = assign(
            self.job_name, self.job.spec, state.slots, generation, self.cluster.rendezvous(state.slots[0])
        )
        assignment.resume_max_step = state.resume_max_step
        assignment.code_version = state.code_version
        now = time.time()
        extra: Extra = {keys.generation(self.job_name, generation): assignment}
        if state.open_incident is not None:
            incident = self.store.get(keys.incident(self.job_name, state.open_incident), Incident)
            if incident is not None:
                incident.restarted_at = now
                extra[keys.incident(self.job_name, incident.id)] = incident
        state.generation, state.phase = generation, JobPhase.RUNNING
        state.started_at = state.started_at or now
        state.generation_started_at = now
        if self._commit(state, revision, extra):
            self._losses, self._hang_second_look_at = [], 0.0
            self._pace, self._paced_step = [], None
            self._pace_quiet_until, self._pace_backoff = 0.0, PACE_QUIET_SECONDS
            log.info(
                "generation started",
                fields={
                    "generation": generation,
                    "slots": state.slots,
                    "standbys": state.standbys,
                    "master": f"{assignment.master_addr}:{assignment.master_port}",
                },
            )
            for node in state.slots:
                self._command(node, generation, AgentAction.RUN)

    def _ensure_nodes(self, state: JobState, revision: int) -> bool:
        """Start slot and standby nodes never started; stop nodes with neither; give the slot of a
        node that died before (re)joining to a new node. True if settled (nothing committed)."""
        known = {n.name: n for n in self.cluster.list_nodes()}
        registered = self._registrations()
        wanted = set(state.slots) | set(state.standbys)
        for name in known:
            if name not in wanted:
                self._stop_in_background(name)
        for name in state.evicted:
            if name not in self._cordoned:
                self.cluster.cordon(name, "evicted by the controller")
                self._cordoned.add(name)
        dead = [s for s in state.slots if s in known and not known[s].alive and s not in registered]
        if dead:
            for slot in dead:
                replacement = f"node-{state.next_node_index}"
                state.slots = [replacement if s == slot else s for s in state.slots]
                state.next_node_index += 1
                self.log.warning(
                    "node died before joining; replacing it", fields={"node": slot, "replacement": replacement}
                )
            self._commit(state, revision)
            return False
        for name in [*state.slots, *state.standbys]:
            if name in known:
                continue
            if name in state.standbys and state.open_incident is not None and state.generation > 0:
                continue  # replenish after the recovery: a booting standby must not slow it down
            self.log.info("starting node", fields={"node": name, "standby": name in state.standbys})
            self.cluster.start_node(name)
        return True

    def _stop_in_background(self, node: str) -> None:
        """Stopping a node waits out its grace period: the next generation must not wait with it."""
        if (thread := self._stopping.get(node)) is not None and thread.is_alive():
            return
        self.log.info("stopping node without a slot", fields={"node": node})
        self._stopping[node] = threading.Thread(
            target=self.cluster.stop_node, args=(node,), name=f"stop-{node}", daemon=True
        )
        self._stopping[node].start()

    def _command(self, node: str, generation: int, action: AgentAction) -> None:
        key = keys.node_command(self.job_name, node)
        current = self.store.get(key, AgentCommand)
        if current is None or (current.generation, current.action) != (generation, action):
            self.store.put(key, AgentCommand(generation=generation, action=action, issued_at=time.time()))

    def _gone_per_cluster(self, nodes: list[str], known: dict[str, NodeInfo] | None = None) -> list[str]:
        """Those of `nodes` whose machine the cluster reports dead (process exited, pod failed)."""
        if known is None:
            known = {n.name: n for n in self.cluster.list_nodes()}
        return [n for n in nodes if n in known and not known[n].alive]

    def _fence_dead_slots(
        self,
        state: JobState,
        registered: dict[str, NodeRegistration],
        log: ContextLogger,
        known: dict[str, NodeInfo] | None = None,
    ) -> None:
        """A slot node whose machine the cluster reports dead is lost now, not when its lease lapses."""
        if gone := self._gone_per_cluster([n for n in state.slots if n in registered], known):
            self._fence(gone, registered, GONE_PER_CLUSTER, log)

    @staticmethod
    def _peer_trouble(workers: list[WorkerStatus], now: float) -> bool:
        """A worker reported, in the last few seconds, a symptom of another rank's failure (its
        peer's socket closed, a collective timed out): bounded, so a chatty job does not make the
        controller list the cluster's nodes every tick for ever."""
        return any(
            m.failure_class in SYMPTOMS and now - m.matched_at < PEER_TROUBLE_SECONDS
            for w in workers
            for m in w.matches
        )

    def _fence(self, nodes: list[str], registered: dict[str, NodeRegistration], why: str, log: ContextLogger) -> None:
        """Revoke the nodes' leases: from here on they are lost nodes, and a zombie agent that wakes
        up finds its lease gone and stops its workers."""
        for node in nodes:
            if (reg := registered.get(node)) is not None:
                log.warning("fencing node", fields={"node": node, "why": why})
                self.store.revoke_lease(reg.lease_id)
                self._fenced[node] = f"{why}; lease revoked"
                del registered[node]  # lost from here on: this tick handles it, not the next one

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

    def _url(self) -> str | None:
        return diagnosis_url(self.store, self._diagnosis_url)

    def _finish(self, state: JobState) -> None:
        """Tell every agent the job is over, wait for them to go, then take their machines away."""
        for thread in self._stopping.values():
            thread.join(timeout=SHUTDOWN_WAIT_SECONDS)
        for node in [*state.slots, *state.standbys]:
            self._command(node, state.generation, AgentAction.SHUTDOWN)
        deadline = time.monotonic() + SHUTDOWN_WAIT_SECONDS
        while time.monotonic() < deadline and any(n.alive for n in self.cluster.list_nodes()):
            time.sleep(0.2)
        for info in self.cluster.list_nodes():
            self.cluster.stop_node(info.name)
        self.log.info("job finished", fields={"phase": state.phase.value, "reason": state.reason})
