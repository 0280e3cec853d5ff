"""The reconcile core: observation -> decision, one branch per stage, no I/O.

`decide` runs the detectors that watch the job's stage, follows the spec's suspend flag, carries out
the oldest operator request, then takes the branch of the current stage, which may move the job
along the transition table. Whatever the stage, the effects that bring the nodes to what the new
state wants (world.py) are derived last. When a branch needs observation it does not have (the
cluster's nodes, a rendezvous address), `decide` returns `Needs` and is asked again with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from stalwart.controller.core import catalog, checks, elastic, replay, requests, standbys, suspension, world
from stalwart.controller.core.decision import Decision, Launch, Needs, Plan
from stalwart.controller.core.detectors.base import (
    CodeUpdateSeen,
    Detector,
    Failure,
    LateVerdict,
    Report,
    RequestFinding,
    View,
)
from stalwart.controller.core.detectors.node_digests import ProgressWatch
from stalwart.controller.core.generation import start_generation
from stalwart.controller.core.ladder import fail, handle
from stalwart.controller.core.observation import Observation
from stalwart.controller.core.progress import note_job_resumed, note_progress, track
from stalwart.controller.core.ranks import role_states, slot_roles
from stalwart.controller.core.standbys import new_node, top_up_standbys
from stalwart.controller.core.transitions import Trigger
from stalwart.store import keys
from stalwart.store.records import Incident, JobStage, JobState

STARTUP_TIMEOUT_SECONDS = 300.0
STANDBY_WAIT_SECONDS = STARTUP_TIMEOUT_SECONDS / 10  # pre-flight waits this long for the standbys to join
# Replacements for slot nodes that die before they join, per slot, between two generation starts. Past
# this the start cannot succeed (an agent that cannot start: a bad setting, a missing directory): the job
# fails with that said, instead of starting node after node until the startup timeout.
DEATHS_BEFORE_JOINING_PER_SLOT = 3

Branch = Callable[[Plan, Observation, View, list[tuple[Detector, Report]]], Needs | None]


def _short_id() -> str:
    return uuid.uuid4().hex[:6]


class ReconcileCore:
    def __init__(self, job: str, detectors: Sequence[Detector], new_id: Callable[[], str] = _short_id) -> None:
        self.job = job
        self.detectors = list(detectors)
        self.new_id = new_id
        self._progress = ProgressWatch()  # the workers' progress, kept per node
        self._catalog = catalog.CatalogFeed()  # the saves the nodes report, merged as they change
        self._branches: dict[JobStage, Branch] = {
            JobStage.STARTING: self._starting,
            JobStage.PREFLIGHT: self._preflight,
            JobStage.RUNNING: self._running,
            JobStage.RESTARTING: self._restarting,
            JobStage.CHECKING: self._checking,
            JobStage.REPLAY_HORIZONTAL: self._replaying,
            JobStage.REPLAY_VERTICAL: self._replaying,
            JobStage.SAVING: self._saving,
            JobStage.SUSPENDING: self._suspending,
            JobStage.SUSPENDED: self._suspended,
        }

    # -- the decision --------------------------------------------------------------------------
    def decide(self, obs: Observation) -> Decision | Needs:
        state = obs.state
        if state is None:
            return self._create(obs)
        plan = Plan(state, obs.revision, obs.now)
        if state.stage.terminal:
            return plan.decision()
        # Every branch sees the job at the size it runs (elastic data parallelism), the spec as declared aside.
        obs = replace(obs, spec=elastic.sized(obs.declared_spec, state), declared=obs.declared_spec)
        view = View.of(obs, state)
        if state.stage is not JobStage.RUNNING:  # (running: track() does it, from the digests)
            note_job_resumed(plan, view.workers, obs.incident, self.job)
        reports = [(d, d.look(view)) for d in self.detectors if state.stage in d.stages]
        needs = Needs()
        for _, report in reports:
            needs = needs | report.needs
        if not obs.satisfies(needs):
            return needs
        more = self._decide(plan, obs, view, reports)
        if more and not obs.satisfies(more):
            return more
        self._attach_late_verdicts(plan, obs, reports)
        world.reconcile(plan, obs)
        plan.consumed.update(view.taken)
        return plan.decision()

    def _decide(self, plan: Plan, obs: Observation, view: View, reports: list[tuple[Detector, Report]]) -> Needs | None:
        standbys.apply_standby_checks(plan, view)
        if suspension.follow(plan, view, self.job, self.new_id):
            return None
        found = next((f for _, r in reports for f in r.findings if isinstance(f, RequestFinding)), None)
        if found is not None and requests.carry_out(plan, found, view, self.job, self.new_id):
            return None
        return self._branches[plan.state.stage](plan, obs, view, reports)

    def acknowledge(self, decision: Decision, now: float) -> None:
        """Tell each detector its finding was acted on: the decision that did is committed."""
        by_name = {d.name: d for d in self.detectors}
        for name, finding in decision.acks:
            if name in by_name:
                by_name[name].handled(finding, now)

    # -- one branch per stage ------------------------------------------------------------------
    def _starting(self, plan: Plan, obs: Observation, view: View, _: list[tuple[Detector, Report]]) -> Needs | None:
        state, ft = plan.state, obs.spec.spec.fault_tolerance
        if self._replace_dead_slots(plan, obs):
            return None
        if all(s in obs.registrations for s in state.slots):
            if not ft.preflight:
                return start_generation(plan, obs, Trigger.GENERATION_STARTED, self.job)
            waiting = [s for s in state.standbys if s not in obs.registrations]
            if waiting and plan.now - (state.stage_since or state.created_at) < STANDBY_WAIT_SECONDS:
                return None  # standbys are checked with the job's nodes when they are up; late ones alone
            plan.enter(Trigger.NODES_READY)
            plan.effect(Launch(checks.preflight_checks(plan, obs)))
        elif plan.now - (state.stage_since or state.created_at) > STARTUP_TIMEOUT_SECONDS:
            missing = [s for s in state.slots if s not in obs.registrations]
            fail(
                plan,
                Trigger.NODES_NEVER_READY,
                "NodesNotReady",
                f"nodes never registered: {', '.join(missing)}",
                self.job,
            )
        return None

    def _preflight(self, plan: Plan, obs: Observation, view: View, _: list[tuple[Detector, Report]]) -> Needs | None:
        work = checks.preflight_checks(plan, obs)
        result = view.result(work.key)
        if result is not None:
            return checks.on_preflight(plan, obs, result, self.job, self.new_id)
        if not view.busy(work.key):
            plan.effect(Launch(work))  # (a controller that restarted mid-check runs it again)
        return None

    def _running(
        self, plan: Plan, obs: Observation, view: View, reports: list[tuple[Detector, Report]]
    ) -> Needs | None:
        state = plan.state
        # The workers as each node's digest sums them (redone for the nodes whose heartbeat changed):
        # at 10,000 nodes, a walk over 80,000 worker records per tick was most of the tick.
        progress, count, exited_zero = self._progress.update(view)
        self._catalog.update(plan, obs, obs.spec.spec.checkpoint.keep_last, self.job)
        track(plan, lambda: view.workers, obs.incident, self.job, progress)
        checkpointed = elastic.checkpoint_committed(plan, obs)
        if count == obs.spec.spec.world_size and exited_zero == count:
            workers = view.workers
            note_progress(plan, workers, force=True)
            # A generation that resumed at the job's last step trains none: the job's step is at
            # least its newest committed checkpoint's.
            saved = [*obs.catalog, *catalog.added_steps(plan)]
            if saved and max(saved) > (state.last_step or 0):
                state.last_step = max(saved)
            state.reason, state.message = "Completed", f"all {len(workers)} workers exited 0"
            plan.enter(Trigger.WORKERS_SUCCEEDED)
            plan.log("info", "job succeeded")
            return None
        failure = next(((d, f) for d, r in reports for f in r.findings if isinstance(f, Failure)), None)
        if failure is not None:
            detector, finding = failure
            handle(plan, finding, view, self.job, self.new_id)
            plan.acks.append((detector.name, finding))
            return None
        if elastic.grow(plan, obs, view, checkpointed, self.job, self.new_id):
            return None
        for detector, report in reports:
            for f in report.findings:
                if isinstance(f, CodeUpdateSeen) and state.code_update_seen_at is None:
                    state.code_update_seen_at = plan.now
                    plan.acks.append((detector.name, f))
                    plan.log("info", "new code version; applying at the next restart", code_version=f.version)
            for work in report.work:
                if not view.busy(work.key):
                    plan.effect(Launch(work))
        if view.cluster is not None:
            standbys.upkeep(plan, view)
        return None

    def _restarting(self, plan: Plan, obs: Observation, view: View, _: list[tuple[Detector, Report]]) -> Needs | None:
        if self._replace_dead_slots(plan, obs):
            return None
        state = plan.state
        missing = [s for s in state.slots if s not in obs.registrations]
        if not missing:
            return start_generation(plan, obs, Trigger.GENERATION_STARTED, self.job)
        if elastic.shrink(plan, obs, self.job):
            return None
        limit = obs.spec.spec.fault_tolerance.restart_timeout_seconds
        if plan.now - (state.stage_since or state.created_at) > limit:
            # A replacement the cluster never started (no standby left, no machine free) would
            # otherwise be waited for as long as the job lives.
            fail(
                plan,
                Trigger.NODES_NEVER_READY,
                "CapacityUnavailable",
                f"the restart waited {limit:g} s for {len(missing)} of {len(state.slots)} nodes to register "
                f"({', '.join(missing)}): no standby was left and the cluster started no machine for them; "
                "stalwart runbook show capacity_unavailable",
                self.job,
            )
        return None

    def _checking(self, plan: Plan, obs: Observation, view: View, _: list[tuple[Detector, Report]]) -> Needs | None:
        state = plan.state
        work = checks.stop_time_checks(plan, obs)
        result = view.result(work.key)
        if result is not None:
            checks.on_stop_time_checks(plan, obs, result, self.job)
            return None
        if view.busy(work.key) or self._replace_dead_slots(plan, obs):
            return None
        if not all(s in obs.registrations for s in state.slots):
            return None
        still = [
            n
            for n in state.restarting_slots()
            if (b := obs.beats.get(n)) and any(w.exit_code is None for w in b.workers)
        ]
        if still:
            return None  # the checks need the machines to themselves
        plan.effect(Launch(work))
        return None

    def _replaying(self, plan: Plan, obs: Observation, view: View, _: list[tuple[Detector, Report]]) -> Needs | None:
        ongoing = plan.state.replay
        if ongoing is not None and ongoing.generation is not None:
            replay.judge_phase(plan, obs, self.job)
            return None
        if self._replace_dead_slots(plan, obs) or not all(s in obs.registrations for s in plan.state.slots):
            return None
        return replay.launch_phase(plan, obs, self.job)

    def _saving(self, plan: Plan, obs: Observation, view: View, _: list[tuple[Detector, Report]]) -> Needs | None:
        self._catalog.update(plan, obs, obs.spec.spec.checkpoint.keep_last, self.job)
        suspension.saving(plan, view, self.job)
        return None

    def _suspending(self, plan: Plan, obs: Observation, view: View, _: list[tuple[Detector, Report]]) -> Needs | None:
        suspension.stopped(plan, view)
        return None

    def _suspended(self, plan: Plan, obs: Observation, view: View, _: list[tuple[Detector, Report]]) -> Needs | None:
        return None  # nothing runs; world.py stops any node that comes back

    # -- helpers -------------------------------------------------------------------------------
    def _attach_late_verdicts(self, plan: Plan, obs: Observation, reports: list[tuple[Detector, Report]]) -> None:
        """A verdict that came after its failure was handled joins its incident (in any stage)."""
        for detector, report in reports:
            for f in report.findings:
                if not isinstance(f, LateVerdict) or f.incident not in obs.incidents:
                    continue
                key = keys.incident(self.job, f.incident)
                written = plan.puts.get(key)  # this decision's own write of it (the recovery's end)
                stored = written if isinstance(written, Incident) else obs.incidents[f.incident]
                if stored is not None:
                    incident = stored.model_copy(deep=True)
                    incident.verdict, incident.diagnosed_at = f.verdict, f.diagnosed_at
                    plan.put(key, incident)
                    plan.log("info", "late verdict attached", incident=incident.id)
                plan.acks.append((detector.name, f))

    def _create(self, obs: Observation) -> Decision:
        spec = obs.spec.spec
        count = len(slot_roles(spec))
        slots = [f"node-{i}" for i in range(count)]
        state = JobState(
            job=self.job,
            slots=slots,
            next_node_index=count,
            code_version=spec.code_version,
            created_at=obs.now,
            updated_at=obs.now,
            roles=role_states(spec),
        )
        top_up_standbys(state, spec)
        plan = Plan(state, 0, obs.now, new=True)
        plan.begin()
        plan.log("info", "job created", slots=slots, standbys=state.standbys)
        return plan.decision()

    def _replace_dead_slots(self, plan: Plan, obs: Observation) -> bool:
        """A slot node the cluster reports dead before it (re)joined gets a new node in its slot.
        True if any did."""
        state, known = plan.state, obs.cluster
        if known is None:
            return False
        dead = [s for s in state.slots if s in known and not known[s].alive and s not in obs.registrations]
        state.died_before_joining += len(dead)
        if state.died_before_joining > DEATHS_BEFORE_JOINING_PER_SLOT * len(state.slots):
            fail(
                plan,
                Trigger.NODES_KEEP_DYING,
                "NodesDiedBeforeJoining",
                f"{state.died_before_joining} slot nodes died before they joined (the last: {', '.join(dead)}); "
                "a node's agent log says why: stalwart runbook show nodes_died_before_joining",
                self.job,
            )
            return True
        for slot in dead:
            role = state.role_of(slot)
            if state.restarting_roles and role is not None and role not in state.restarting_roles:
                state.restarting_roles = [r for r in state.roles if r in {*state.restarting_roles, role}]
                plan.log("warning", "a node of a running role died during a role's recovery", role=role)
            replacement = new_node(state)
            state.slots = [replacement if s == slot else s for s in state.slots]
            plan.log("warning", "node died before joining; replacing it", node=slot, replacement=replacement)
        return bool(dead)
