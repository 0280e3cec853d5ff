"""The loop's guarantees: one guarded commit per decision, effects only after it holds, and a
controller killed at any point replaced by one that carries on without a second restart or a lost
incident. Also: suspend and resume end to end, with ETTR leaving the suspension out."""

from __future__ import annotations

import pytest
from support.controller_harness import JOB, Harness, worker

from stalwart.controller.core.decision import Decision
from stalwart.controller.core.ettr import compute_ettr
from stalwart.store import keys
from stalwart.store.records import JobStage, JobState, SavedCheckpoint

S = JobStage


class Killed(Exception):
    """The controller died (raised from its after-commit hook)."""


def lost_node_job() -> Harness:
    """Generation 1 running on node-0 and node-1 with standby node-2; node-1's lease then lapses."""
    h = Harness(standbys={"count": 1})
    h.put_state(
        stage=S.RUNNING,
        generation=1,
        standbys=["node-2"],
        standbys_checked=["node-2"],
        next_node_index=3,
        generation_started_at=h.clock.now - 50,
        first_step_at=h.clock.now - 49,
    )
    h.join("node-0", "node-1", "node-2", generation=1)
    h.run_generation(1, ["node-0", "node-1"], first_step_at=h.clock.now - 49, first_step=1)
    h.clock.advance(1)
    h.lapse("node-1")
    return h


def test_a_decision_whose_state_moved_under_it_writes_nothing_and_acts_on_nothing() -> None:
    h = lost_node_job()
    observe = h.controller.observer.observe

    def someone_writes_after_we_read(*args: object) -> object:
        obs = observe(*args)  # type: ignore[arg-type]
        h.store.put(keys.job_state(JOB), h.state())  # same content, new revision
        return obs

    h.controller.observer.observe = someone_writes_after_we_read  # type: ignore[method-assign,assignment]
    calls = list(h.cluster.calls)
    h.tick()
    assert not h.controller.committed and h.incidents() == [] and h.cluster.calls == calls
    assert h.command("node-2") is None
    h.controller.observer.observe = observe  # type: ignore[method-assign]
    h.tick()
    assert h.controller.committed and len(h.incidents()) == 1


def test_a_controller_that_lost_its_leadership_writes_nothing() -> None:
    h = lost_node_job()
    h.store.put(h.controller.leader.key, "another controller")
    h.tick()
    assert not h.controller.committed and h.incidents() == [] and h.state().stage is S.RUNNING


def test_effects_run_only_after_the_commit() -> None:
    h = lost_node_job()
    seen: list[tuple[JobStage, list[tuple[str, str]]]] = []

    def at_commit(decision: Decision) -> None:
        seen.append((h.state().stage, list(h.cluster.calls)))

    h.controller = h.new_controller(after_commit=[at_commit])
    before = list(h.cluster.calls)
    h.tick()
    [(stage, calls)] = seen
    assert stage is S.RESTARTING and calls == before  # committed, nothing done yet
    assert ("cordon", "node-1") in h.cluster.calls  # and then done


def _recover_killing_after(commit_to_die_after: int) -> tuple[Harness, bool]:
    """Run the lost-node recovery to generation 2, the controller dying right after its n-th commit
    (before that decision's effects), each death replaced by a new controller."""
    h = lost_node_job()
    commits, killed = 0, False

    def die(decision: Decision) -> None:
        nonlocal commits
        commits += 1
        if commits == commit_to_die_after:
            raise Killed

    h.controller = h.new_controller(after_commit=[die])
    h.cluster.on_start = lambda node: h.join(node, generation=0)
    for _ in range(30):  # 3 s: past a pool check (once per heartbeat interval) after the recovery
        try:
            h.tick()
        except Killed:
            killed = True
            h.new_controller()  # its successor: fresh memory, same etcd
        state = h.state()
        if state.generation == 2 and state.stage is S.RUNNING:
            h.run_generation(2, state.slots, first_step_at=h.clock.now, first_step=41)
        h.clock.advance(0.1)
    return h, killed


@pytest.mark.parametrize("die_after", [1, 2, 3])  # evicted; generation 2 started; recovered
def test_a_controller_killed_at_any_commit_of_a_recovery_is_replaced_without_a_second_restart(die_after: int) -> None:
    h, killed = _recover_killing_after(die_after)
    assert killed
    state = h.state()
    [incident] = h.incidents()
    assert incident.failure_class.value == "LostNode" and incident.evicted == ["node-1"]
    assert incident.replacements == {"node-1": "node-2"} and incident.first_step_at is not None
    assert state.stage is S.RUNNING and state.generation == 2 and state.open_incident is None
    assert state.slots == ["node-0", "node-2"] and state.standbys == ["node-3"] and state.evicted == ["node-1"]
    assert state.restarts == 0 and state.infra_restarts == 1
    assert h.command("node-0") == (2, "run") and h.command("node-2") == (2, "run")
    assert "node-3" in h.cluster.called("start")  # the pool is replenished once the recovery is over


def test_the_step_at_failure_is_at_least_the_checkpoint_the_job_resumed_from() -> None:
    """Heartbeats lag the workers: node-1 was lost at step 21 while they still said 18, and the
    job resumed from the checkpoint at step 20, which it had reached before the failure."""
    h = Harness(standbys={"count": 1})
    h.put_state(stage=S.RUNNING, generation=1, standbys=["node-2"], standbys_checked=["node-2"], next_node_index=3)
    h.join("node-0", "node-1", "node-2", generation=1)
    h.run_generation(1, ["node-0", "node-1"], first_step_at=h.clock.now - 9, first_step=1, step=18)
    h.clock.advance(1)
    h.lapse("node-1")
    h.cluster.on_start = lambda node: h.join(node, generation=0)
    for _ in range(30):
        h.tick()
        state = h.state()
        if state.generation == 2 and state.stage is S.RUNNING and state.open_incident is not None:
            h.run_generation(2, state.slots, first_step_at=h.clock.now, first_step=21, step=21)
        h.clock.advance(0.1)
    [incident] = h.incidents()
    assert incident.resumed_step == 21 and incident.step_at_failure == 20, incident
    assert incident.lost_work_seconds == 0, incident


def test_a_generation_start_asks_for_the_cluster_then_the_rendezvous_in_one_tick() -> None:
    h = Harness()
    h.put_state(stage=S.RESTARTING, generation=1)
    h.join("node-0", "node-1", generation=1)
    h.tick()
    assert h.state().generation == 2 and h.controller.committed


def test_suspend_stops_everything_records_nothing_and_resume_starts_a_new_generation() -> None:
    h = lost_node_job()
    h.join("node-1", generation=1)  # nothing is lost in this one
    h.run_generation(1, ["node-0", "node-1"], step=37, first_step_at=h.clock.now - 49, first_step=1)
    h.cluster.nodes.update({n: h.cluster.nodes.get(n) or _alive(n) for n in ("node-0", "node-1", "node-2")})
    h.set_spec(suspend=True, standbys={"count": 1})
    h.tick()
    # A running job checkpoints first: the workers run on until a node reports the step asked for.
    asked = h.state().suspensions[-1].save_step
    assert h.state().stage is S.SAVING and h.state().last_step == 37 and asked is not None and asked > 37
    assert h.command("node-0") == (1, "run") and h.cluster.called("stop") == []
    saved = SavedCheckpoint(step=asked, generation=1, committed_at=h.clock.now)
    h.beat("node-0", 1, [worker(0, step=asked), worker(1, step=asked)], checkpoints=[saved])
    h.tick()
    assert h.state().stage is S.SUSPENDING and h.state().suspensions[-1].saved_step == asked
    assert h.command("node-0") == (1, "stop")
    h.tick()  # (Suspending lists the cluster every tick: the nodes stop)
    assert sorted(h.cluster.called("stop")) == ["node-0", "node-1", "node-2"]
    for node in ("node-0", "node-1", "node-2"):
        h.lapse(node)  # the agents go, and their leases with them: no lost node for it
    h.clock.advance(100)
    h.tick()
    assert h.state().stage is S.SUSPENDED and h.incidents() == []
    h.clock.advance(1000)
    h.tick()
    assert h.state().stage is S.SUSPENDED and h.incidents() == []
    h.set_spec(standbys={"count": 1})
    h.tick()
    assert h.state().stage is S.STARTING
    h.cluster.on_start = lambda node: h.join(node)
    h.tick(2)
    state = h.state()
    assert state.stage is S.RUNNING and state.generation == 2 and state.restarts == 0 and h.incidents() == []
    assert [(s.ended_at or 0) - s.started_at for s in state.suspensions] == [1100]
    ettr = compute_ettr(state, [], h.clock.now)
    assert ettr.window_seconds == pytest.approx(h.clock.now - (state.first_step_at or 0) - 1100)


def test_a_job_created_suspended_starts_no_node() -> None:
    h = Harness(suspend=True)
    h.tick(3)
    assert h.state().stage is S.SUSPENDED and h.cluster.called("start") == []


def test_a_finished_job_decides_nothing() -> None:
    h = Harness()
    h.put_state(stage=S.SUCCEEDED, generation=3, reason="Completed")
    state = h.tick()
    assert isinstance(state, JobState) and state.stage is S.SUCCEEDED and h.decision.effects == []


def test_only_the_transition_table_changes_a_stage() -> None:
    """The table is the only place a phase changes: no other module of the platform that knows the
    job's stages (JobStage) assigns one (other `.stage`s, like the RLHF relay's, are not the job's)."""
    import re

    from support.paths import REPO

    offenders = [
        f"{path.relative_to(REPO)}:{n}"
        for path in (REPO / "platform").rglob("*.py")
        if path.name != "transitions.py" and "JobStage" in (text := path.read_text())
        for n, line in enumerate(text.splitlines(), 1)
        if re.search(r"\.stage(, \w+)? = |\.stage_since = ", line)
    ]
    assert offenders == []


def _alive(node: str) -> object:
    from stalwart.cluster.base import NodeInfo

    return NodeInfo(name=node, alive=True)


def test_the_controller_rides_out_an_unreachable_etcd(monkeypatch: pytest.MonkeyPatch) -> None:
    """etcd away for a few ticks (restarting, paused): the loop retries instead of exiting, and
    carries on when it answers (issue 16)."""
    from stalwart.controller.shell import loop as controller_module
    from stalwart.store.client import StoreUnavailable
    from stalwart.store.records import JobPhase

    h = Harness()
    h.put_state(stage=S.SUCCEEDED, generation=3, reason="Completed")
    controller = h.new_controller()
    h.store.delete(controller.leader.key)  # run() takes the leadership itself
    monkeypatch.setattr(controller_module, "ETCD_RETRY_SECONDS", 0.01)
    real, failures = h.store.get_with_revision, iter(range(3))

    def flaky(*args: object, **kwargs: object) -> object:
        if next(failures, None) is not None:
            raise StoreUnavailable("etcd at 127.0.0.1:2379 timed out")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(h.store, "get_with_revision", flaky)
    assert controller.run(leader_timeout=5) is JobPhase.SUCCEEDED
    assert next(failures, None) is None  # every failure was met, and ridden out
