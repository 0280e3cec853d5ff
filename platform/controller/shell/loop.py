"""The job controller: a small loop (the shell) around a pure decision (the core, ../core), with the
job's state in etcd.

Each tick:

    observe   the job's state and revision, its nodes' registrations, heartbeats and commands, the
              oldest pending operator request, the open incident, the cluster's nodes when they
              matter, and the results of long work that finished (shell/observer.py)
    decide    observation -> decision (core/reconcile.py, no I/O): the new state, the keys written
              with it, the effects. Detectors (detectors/) report findings; the ladder
              (core/ladder.py, over policy.decide) turns a failure into a rung and an incident; the
              transition table (core/transitions.py) is the only place the stage changes
    commit    one guarded etcd transaction: we still lead, the state's revision is the one we read,
              and so is every operator request the decision answers. A decision that writes
              nothing commits nothing
    act       only then the effects (shell/actuator.py): commands to agents, nodes started,
              stopped, cordoned and fenced, long work launched (shell/work.py) off the loop, log lines

Long work (pre-flight and stop-time checks, stack captures for hangs and slowdowns, crash log
diagnosis) never blocks a tick: it runs on threads and comes back as part of a later observation.
Effects are level-triggered (derived from committed state, idempotent), so a controller killed at
any point is replaced by one that reads the same state and carries on: it neither repeats a restart
nor loses an incident (every eviction is committed with its incident and its cordon). While a
recovery moves (a tick committed), the next tick runs at once instead of after TICK_SECONDS.

When ticks run: at once when the watches bring something that moves the job's stage (a node joined
or lost its lease, a worker started, exited or matched a log signature, an operator request:
shell/observer.py's JobView); every TICK_SECONDS while the job's nodes start, stop or are checked, and for
ALERT_SECONDS after a sign of trouble (a lost lease, an exit, a log signature, a machine fault).
A job that runs, or stays suspended, with nothing new is ticked every IDLE_TICK_SECONDS, for the
detectors that act on time passing (hangs, slowdowns, silent nodes).

The stages and the transitions between them: core/transitions.py (the table, with its diagram).
"""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from stalwart.cluster import Cluster
from stalwart.controller.core.decision import Decision, Needs
from stalwart.controller.core.detectors import Detector, default_detectors
from stalwart.controller.core.policy import outage_grace
from stalwart.controller.core.reconcile import ReconcileCore
from stalwart.controller.core.work import WorkKey, WorkResult
from stalwart.controller.shell.actuator import Actuator
from stalwart.controller.shell.clock import Clock, SystemClock
from stalwart.controller.shell.diagnosis import diagnosis_url
from stalwart.controller.shell.observer import Observer
from stalwart.controller.shell.work import Runner, ThreadRunner, WorkContext, perform
from stalwart.logs import ContextLogger, get_logger
from stalwart.store import keys
from stalwart.store.client import MAX_TXN_OPS, LeaseLost, Store, StoreUnavailable
from stalwart.store.election import LeaseElection
from stalwart.store.records import JobPhase, JobStage, JobState, Record

TICK_SECONDS = 0.1  # the most often the loop ticks (a recovery's hurried ticks aside)
IDLE_TICK_SECONDS = 0.5  # a running or suspended job with nothing new: the time-based detectors' step
ALERT_SECONDS = 5.0  # ticks stay TICK_SECONDS apart for this long after a sign of trouble
QUIET_STAGES = frozenset({JobStage.RUNNING, JobStage.SUSPENDED})
MAX_HURRIED_TICKS = 4  # ticks run back to back while each one commits a step of a recovery
MAX_DECIDE_ROUNDS = 3  # a decision may ask for more observation (the cluster, then a rendezvous)
RESULT_TTL_SECONDS = 600.0  # a result no decision read by then is for a stage long gone
SHUTDOWN_WAIT_SECONDS = 30.0
ETCD_RETRY_SECONDS = 0.5
FULL_COLLECTION_SECONDS = 300.0  # the controller's objects are collected in full this often (CollectorPacing)
AfterCommit = Callable[[Decision], None]


def tick_interval(stage: JobStage | None, alert: bool) -> float:
    """How long the loop waits for a notice before it ticks anyway (module docstring)."""
    return IDLE_TICK_SECONDS if stage in QUIET_STAGES and not alert else TICK_SECONDS


class CollectorPacing:
    """Python's cyclic garbage collector, paced by the loop. At 10,000 nodes the controller holds
    millions of objects (each node's last heartbeat and metric window); a full collection, which the
    interpreter starts by itself whenever enough objects survived, walks all of them (0.3-1 s) in the
    middle of whatever tick runs. So after each tick what survived it is frozen (`gc.freeze`: the
    collector no longer walks it; reference counts still free it), and the automatic collections look
    only at what the ticks since allocated; every FULL_COLLECTION_SECONDS, between two ticks, the
    frozen objects are collected in full, so that cyclic garbage among them is not kept."""

    def __init__(self, every: float = FULL_COLLECTION_SECONDS) -> None:
        self.every = every
        self._full_at = time.monotonic() + every

    def after_tick(self) -> None:
        now = time.monotonic()
        if now >= self._full_at:
            gc.unfreeze()
            gc.collect()
            self._full_at = now + self.every
        gc.freeze()


class NotLeader(RuntimeError):
    pass


def commit_chunks(puts: Mapping[str, Record | str], deletes: Sequence[str]) -> list[dict[str, Record | str]]:
    """The cordons that must go ahead of a decision's last transaction for it to stay within
    MAX_TXN_OPS operations, in transactions of at most MAX_TXN_OPS; [] when it fits as it is."""
    if len(puts) + len(deletes) <= MAX_TXN_OPS:
        return []
    cordons = [k for k in puts if k.startswith(keys.cordons_prefix())]
    keep = len(puts) + len(deletes) - len(cordons)
    if keep > MAX_TXN_OPS:
        raise ValueError(f"a decision writes {keep} keys besides its cordons: over etcd's {MAX_TXN_OPS} a transaction")
    ahead = cordons[: len(cordons) - (MAX_TXN_OPS - keep)]
    return [{k: puts[k] for k in ahead[i : i + MAX_TXN_OPS]} for i in range(0, len(ahead), MAX_TXN_OPS)]


class JobController:
    def __init__(
        self,
        store: Store,
        cluster: Cluster,
        job_name: str,
        diagnosis_url: str | None = None,
        *,
        clock: Clock | None = None,
        detectors: Sequence[Detector] | None = None,
        runner: Runner | None = None,
        after_commit: Sequence[AfterCommit] = (),
    ) -> None:
        """`after_commit` hooks run after each commit that held, before its effects (fault
        injection uses one to die at the worst moment)."""
        self.store, self.cluster, self.job_name = store, cluster, job_name
        self.clock = clock or SystemClock()
        self.log: ContextLogger = get_logger("stalwart.controller", job=job_name)
        self._wake = threading.Event()
        self._alert_until = -math.inf  # time.monotonic() until which ticks stay TICK_SECONDS apart
        self.observer = Observer(store, cluster, job_name, self.clock, self.log, notice=self._notice)
        ft = self.observer.spec().spec.fault_tolerance  # raises if the job is not in etcd
        self.etcd_outage = EtcdAbsence(self.log, ft.etcd_outage_seconds)
        self._outage_window = outage_grace(ft)
        self.leader = Leadership(store, job_name, ttl=ft.lease_ttl_seconds)
        self._diagnosis_url = diagnosis_url
        context = WorkContext(store, cluster, job_name, self._url, self.log, self.clock)
        self.runner: Runner = runner or ThreadRunner(lambda work: perform(work, context), self._wake)
        self.core = ReconcileCore(job_name, default_detectors() if detectors is None else detectors)
        self.actuator = Actuator(
            store, cluster, job_name, self.runner, self.clock, wrote=self.observer.view.wrote_command
        )
        self._after_commit = list(after_commit)
        self._results: dict[WorkKey, WorkResult] = {}
        self.committed = False  # whether the last tick's decision wrote, and its commit held
        self.last: Decision | None = None  # the last tick's decision
        self._collector = CollectorPacing()

    # -- the loop ------------------------------------------------------------------------------
    def run(self, leader_timeout: float = 60.0) -> JobPhase:
        if not self.leader.acquire(timeout=leader_timeout):
            raise NotLeader(f"another controller holds {self.leader.key}")
        self.log.info("leading", fields={"identity": self.leader.identity})
        try:
            hurried = 0
            while True:
                self._wake.clear()
                began, began_mono = self.clock.time(), time.monotonic()
                try:
                    self._keep_leading()
                    state = self.tick()
                except StoreUnavailable as exc:
                    # etcd is away (restarting, paused, starved): decide nothing, try again. A tick
                    # cut short is safe: its commit held or not as a whole, and effects follow the
                    # state on the next tick.
                    self.etcd_outage.failed(began, exc)
                    self._wake.wait(ETCD_RETRY_SECONDS)
                    continue
                self.etcd_outage.answered(self.clock.time())
                if state is not None and state.stage.terminal:
                    self._finish(state)
                    return state.phase
                self._collector.after_tick()
                # A tick that moved the state (a failure handled, a generation started) is followed
                # at once by the next step of the recovery, a few times in a row at most.
                hurried = hurried + 1 if self.committed and hurried < MAX_HURRIED_TICKS else 0
                if not hurried:
                    self._wait_for_next_tick(state, began_mono)
        except LeaseLost:
            raise NotLeader("leadership lapsed") from None
        finally:
            self.observer.close()
            self.leader.release()

    def _notice(self, trouble: bool) -> None:
        """Something the controller acts on at once arrived (on a watch's thread); `trouble`: a
        failure may be unfolding (a peer's loss shows in steps: an exit, a lost lease, a listing)."""
        if trouble:
            self._alert_until = time.monotonic() + ALERT_SECONDS
        self._wake.set()

    def _wait_for_next_tick(self, state: JobState | None, began: float) -> None:
        """Until a notice or finished work wakes the loop, or the next timed tick is due (module
        docstring); never sooner than TICK_SECONDS after the last tick began."""
        stage = None if state is None else state.stage
        self._wake.wait(tick_interval(stage, alert=time.monotonic() < self._alert_until))
        rest = TICK_SECONDS - (time.monotonic() - began)
        if rest > 0:
            time.sleep(rest)  # a burst of notices (many nodes at once) is one tick, not one each

    def _keep_leading(self) -> None:
        """Raises LeaseLost once we no longer lead. A leadership that lapsed because etcd was away
        (a pause longer than its TTL) is taken again, unless another controller took it meanwhile."""
        try:
            self.leader.keep()
        except LeaseLost:
            if not self.etcd_outage.explains(self.clock.time(), self._outage_window) or not self.leader.regain():
                raise
            self.log.warning("leadership lapsed while etcd was away; leading again")

    def tick(self) -> JobState | None:
        """Observe, decide, commit, act. Returns the job's state as etcd holds it after the tick."""
        self.committed = False
        for result in self.runner.take():
            self._results[result.key] = result
        now = self.clock.time()
        self._results = {k: r for k, r in self._results.items() if now - r.finished_at < RESULT_TTL_SECONDS}
        obs = replace(
            self.observer.observe(self._results, self.runner.in_flight()), etcd_back_at=self.etcd_outage.back_at
        )
        decision = self.core.decide(obs)
        for _ in range(MAX_DECIDE_ROUNDS):
            if not isinstance(decision, Needs):
                break
            obs = self.observer.complete(obs, decision)
            decision = self.core.decide(obs)
        if isinstance(decision, Needs):
            raise RuntimeError(f"the core keeps asking for more observation: {decision}")
        self.last = decision
        if decision.writes and not self._commit(decision):
            return obs.state  # the state moved under us: re-read next tick, do nothing now
        for key in decision.consumed:
            self._results.pop(key, None)
        if decision.writes:
            self.core.acknowledge(decision, obs.now)
            for hook in self._after_commit:
                hook(decision)
        state = decision.state or obs.state
        log = self.log if state is None else self.log.bind(generation=state.generation, stage=state.stage.value)
        self.actuator.apply(decision.effects, log)
        return state

    def _commit(self, decision: Decision) -> bool:
        """One guarded transaction: we lead, the state is as we read it, and so is every key in the
        decision's guards (an operator request nobody withdrew meanwhile).

        etcd takes at most MAX_TXN_OPS operations in a transaction: an eviction of more nodes than
        that (a rack, a mass lease loss) writes its cordons first, in transactions under the same
        guards, and the state with the rest last. A controller killed in between leaves cordons
        of an eviction that never committed; the next one decides again from the same state."""
        assert decision.state is not None
        decision.state.updated_at = self.clock.time()
        state_key = keys.job_state(self.job_name)
        guards = {state_key: decision.revision, **decision.guards}
        puts: dict[str, Record | str] = {state_key: decision.state, **decision.puts}
        for chunk in commit_chunks(puts, decision.deletes):
            if not self.store.commit(chunk, expect_value=self.leader.guard, expect_revision=guards):
                self.committed = False
                self.log.warning("state changed under us; re-reading")
                return False
            for key in chunk:
                puts.pop(key)
        ok = self.store.commit(puts, expect_value=self.leader.guard, expect_revision=guards, deletes=decision.deletes)
        self.committed = ok
        if not ok:
            self.log.warning("state changed under us; re-reading")
        return ok

    # -- around the loop -----------------------------------------------------------------------
    def _url(self) -> str | None:
        return diagnosis_url(self.store, self._diagnosis_url)

    def _finish(self, state: JobState) -> None:
        """Tell every agent the job is over, wait for them to go, then take their machines away."""
        self.actuator.shut_down([*state.slots, *state.standbys], state.generation, SHUTDOWN_WAIT_SECONDS, self.log)
        deadline = time.monotonic() + SHUTDOWN_WAIT_SECONDS
        while time.monotonic() < deadline and any(n.alive for n in self.cluster.list_nodes()):
            time.sleep(0.2)
        for info in self.cluster.list_nodes():
            self.cluster.stop_node(info.name)
        self.log.info("job finished", fields={"phase": state.phase.value, "reason": state.reason})


# -- leadership ------------------------------------------------------------------------------------------


class Leadership(LeaseElection):
    """At most one active controller per job: the job's leader key, held under the leader's lease."""

    def __init__(self, store: Store, job: str, ttl: int = 5) -> None:
        super().__init__(store, keys.job_leader(job), ttl)


# -- etcd going away -------------------------------------------------------------------------------------


class EtcdAbsence:
    """What the loop saw of etcd going away and coming back.

    While etcd does not answer the loop decides nothing. When it answers again, leases may have lapsed
    meanwhile (etcd expires them by its own clock, and a pause longer than the TTL does it to every one
    at once): the agents register again under new leases within a heartbeat or two, so the lost-node
    detector gives them `outage_grace` (core/policy.py) from etcd's return before it counts a missing
    lease as a lost node. The controller's own leadership may have lapsed the same way: it takes it
    again if nobody else did.
    """

    def __init__(self, log: ContextLogger, limit: float) -> None:
        """`limit`: faultTolerance.etcdOutageSeconds, past which the agents stop their workers."""
        self.log, self.limit = log, limit
        self.since: float | None = None  # etcd stopped answering (None: it answers)
        self.back_at: float | None = None  # when it last answered again after not answering
        self._past_limit = False

    def failed(self, now: float, exc: Exception) -> None:
        if self.since is None:
            self.since = now
            self.log.warning("etcd unreachable; retrying", fields={"error": str(exc), "limit_seconds": self.limit})
        if not self._past_limit and now - self.since > self.limit:
            self._past_limit = True
            self.log.error(
                "etcd unreachable for longer than faultTolerance.etcdOutageSeconds: the agents stop "
                "their workers; nodes that do not come back when etcd does are replaced",
                fields={"away": round(now - self.since, 1), "limit_seconds": self.limit},
            )

    def answered(self, now: float) -> None:
        if self.since is not None:
            self.log.info("etcd is back", fields={"after": round(now - self.since, 1)})
            self.since, self.back_at, self._past_limit = None, now, False

    def explains(self, now: float, window: float) -> bool:
        """etcd is away, or came back less than `window` ago: a lapsed lease may be its doing."""
        return self.since is not None or (self.back_at is not None and now - self.back_at <= window)
