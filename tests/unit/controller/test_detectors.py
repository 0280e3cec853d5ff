"""Each detector, through real controller ticks on the in-memory fakes: what it finds, when it waits,
and that a finding acted on is not reported again."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.controller_harness import Harness, worker

from stalwart.controller.core.decision import FenceNode
from stalwart.controller.core.detectors.base import PEER_TROUBLE_SECONDS, View
from stalwart.controller.core.detectors.crashes import CRASH_DIAGNOSIS_WAIT
from stalwart.controller.core.detectors.lost_nodes import GONE_PER_CLUSTER
from stalwart.controller.core.detectors.slowdowns import METRIC_SAMPLES
from stalwart.controller.core.observation import Observation
from stalwart.controller.core.work import Diagnosis as Finding
from stalwart.store.records import JobStage, LogMatch, RequestKind, RequestStatus

S = JobStage


def peer_closed(at: float, cls: str = "peer_closed") -> list[LogMatch]:
    return [LogMatch(failure_class=cls, scope="job", severity="error", line="...", line_number=1, matched_at=at)]


# -- lost nodes ----------------------------------------------------------------------------------
def test_a_peer_loss_symptom_lists_the_cluster_and_fences_the_dead_machine_in_the_same_tick() -> None:
    h = Harness(standbys={"count": 1})
    h.running(standbys=["node-2"], next_node_index=3)
    h.join("node-2")
    h.tick()  # the pool check lists the cluster now; the next ticks would not, for a heartbeat interval
    h.clock.advance(0.1)
    h.cluster.kill("node-1")
    h.tick()
    assert h.state().stage is S.RUNNING  # nothing says so yet: the cluster was not asked
    h.clock.advance(0.1)
    h.beat("node-0", 1, [worker(0, matches=peer_closed(h.clock.now)), worker(1)])
    h.tick()
    [incident] = h.incidents()
    assert incident.evidence == [f"node-1: {GONE_PER_CLUSTER}; lease revoked"]
    assert incident.replacements == {"node-1": "node-2"} and h.state().stage is S.RESTARTING
    assert [e for e in h.decision.effects if isinstance(e, FenceNode)] == [
        FenceNode("node-1", h.leases["node-1"].id, GONE_PER_CLUSTER)
    ]
    assert "node-1" not in h.controller.observer.observe({}, frozenset()).registrations  # its lease is revoked


def test_a_peer_loss_symptom_is_recent_or_ignored() -> None:
    """A chatty job must not make the controller list the cluster's nodes (pods) every tick for ever."""
    h = Harness()
    h.running()
    obs = h.controller.observer.observe({}, frozenset())
    assert obs.state is not None

    def trouble(*matches: LogMatch) -> bool:
        h.beat("node-0", 1, [worker(0, matches=list(matches)), worker(1)])
        return View.of(h.controller.observer.observe({}, frozenset()), obs.state).peer_trouble()  # type: ignore[arg-type]

    now = h.clock.now
    assert trouble(*peer_closed(now - 0.1)) and trouble(*peer_closed(now - 1, "nccl_timeout"))
    assert not trouble(*peer_closed(now, "python_exception"))  # not a peer's loss
    assert not trouble(*peer_closed(now - PEER_TROUBLE_SECONDS - 1))
    h.tick()
    h.clock.advance(0.1)
    h.beat("node-0", 1, [worker(0, matches=peer_closed(h.clock.now - PEER_TROUBLE_SECONDS - 1)), worker(1)])
    h.tick()
    assert h.controller.last is not None and h.controller.observer._listed_at < h.clock.now  # not listed again
    h.beat("node-0", 1, [worker(0, matches=peer_closed(h.clock.now)), worker(1)])
    h.tick()
    assert h.controller.observer._listed_at == h.clock.now


def test_a_node_silent_after_its_peers_crashed_is_fenced_once_its_patience_is_out() -> None:
    """node-1's workers crash on node-0's closed sockets; node-0 says nothing. Patience: three
    heartbeats and half the lease TTL (here max(3 x 1 s, 2.5 s) = 3 s)."""
    h = Harness()
    h.running()
    h.clock.advance(0.5)
    died = h.clock.now
    h.beat("node-1", 1, [worker(2, exit_code=1, exited_at=died), worker(3, exit_code=1, exited_at=died)])
    h.tick()
    assert h.incidents() == [] and h.runner.launched == []  # neither the crash nor the silence is judged yet
    h.clock.advance(3.1)
    h.beat("node-1", 1, [worker(2, exit_code=1, exited_at=died), worker(3, exit_code=1, exited_at=died)])
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "LostNode"
    assert incident.evidence == ["node-0: silent for 3s since its peers crashed; lease revoked"]


# -- crashes -------------------------------------------------------------------------------------
def test_diagnosis_naming_a_machine_upgrades_a_plain_crash_to_an_eviction() -> None:
    h = Harness(standbys={"count": 1})
    h.running(standbys=["node-2"], next_node_index=3)
    h.join("node-2")
    h.beat("node-1", 1, [worker(2), worker(3, exit_code=-11, exited_at=h.clock.now)])
    h.tick()
    [crash] = [w for w in h.runner.launched if w.key[0] == "crash"]
    verdict = {"failure_class": "xid", "summary": "Xid 79 on node-1"}
    h.runner.finish(crash.key, diagnosis=Finding(["node-1"], ["Xid 79: GPU fell off the bus"], verdict, "xid"))
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "MachineFault" and incident.evicted == ["node-1"]
    assert incident.runbook == "xid" and incident.verdict == verdict
    assert "Xid 79: GPU fell off the bus" in incident.evidence


def test_the_killed_rank_is_the_root_even_when_its_peers_exit_first() -> None:
    """Gloo peers die of the killed rank's closed socket within milliseconds, and an agent may see
    them first: rank 0 is polled before rank 1, and node-1's agent polls earlier. The root is the
    rank that did not die of a peer's failure."""
    h = Harness()
    h.running()
    now = h.clock.now
    victim = {"failure_class": "peer_closed", "failure_reason": "peer_closed: Connection closed by peer"}
    h.beat(
        "node-1",
        1,
        [worker(2, exit_code=1, exited_at=now - 0.2, **victim), worker(3, exit_code=1, exited_at=now - 0.2, **victim)],
    )
    h.beat(
        "node-0",
        1,
        [worker(0, exit_code=1, exited_at=now - 0.1, **victim), worker(1, exit_code=-9, exited_at=now - 0.1)],
    )
    h.tick()
    h.clock.advance(CRASH_DIAGNOSIS_WAIT + 0.5)
    h.beat(
        "node-0",
        1,
        [worker(0, exit_code=1, exited_at=now - 0.1, **victim), worker(1, exit_code=-9, exited_at=now - 0.1)],
    )
    h.beat(
        "node-1",
        1,
        [worker(2, exit_code=1, exited_at=now - 0.2, **victim), worker(3, exit_code=1, exited_at=now - 0.2, **victim)],
    )
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "WorkerCrash" and incident.rank == 1 and incident.exit_code == -9
    assert incident.evidence[0].startswith("rank 1 on node-0")


def test_a_verdict_that_comes_after_the_wait_is_attached_to_its_incident() -> None:
    """The crash is handled without its verdict after CRASH_DIAGNOSIS_WAIT; the verdict that comes
    later (the job already in its stop-time checks) joins the incident in etcd with its time."""
    h = Harness()
    h.running()
    h.beat("node-1", 1, [worker(2), worker(3, exit_code=-9, exited_at=h.clock.now)])
    h.tick()
    [crash] = [w for w in h.runner.launched if w.key[0] == "crash"]
    h.clock.advance(CRASH_DIAGNOSIS_WAIT + 0.5)
    h.beat("node-0", 1, [worker(0), worker(1)])
    h.beat("node-1", 1, [worker(2), worker(3, exit_code=-9, exited_at=h.clock.now - CRASH_DIAGNOSIS_WAIT - 0.5)])
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "WorkerCrash" and incident.verdict is None and incident.diagnosed_at is None
    assert h.state().stage is not S.RUNNING
    h.clock.advance(3)
    verdict = {"failure_class": "worker_crash", "summary": "rank 3 was killed (SIGKILL)"}
    h.runner.finish(crash.key, diagnosis=Finding(["node-1"], ["rank 3: signal 9"], verdict, None))
    h.tick()
    [incident] = h.incidents()
    assert incident.verdict == verdict and incident.diagnosed_at == h.clock.now
    assert incident.evicted == [] and incident.failure_class.value == "WorkerCrash"  # the decision stands
    h.tick()
    assert h.incidents()[0].verdict == verdict and h.runner.done == []  # attached once, nothing left


def test_a_verdict_in_time_rides_in_the_incident_with_its_time() -> None:
    h = Harness()
    h.running()
    h.beat("node-1", 1, [worker(2), worker(3, exit_code=-9, exited_at=h.clock.now)])
    h.tick()
    [crash] = [w for w in h.runner.launched if w.key[0] == "crash"]
    h.clock.advance(1)
    h.runner.finish(crash.key, diagnosis=Finding([], [], {"failure_class": "worker_crash"}, None))
    h.tick()
    [incident] = h.incidents()
    assert incident.verdict == {"failure_class": "worker_crash"} and incident.diagnosed_at == h.clock.now


def test_a_user_code_error_is_retried_once_then_fails_the_job_with_its_traceback() -> None:
    h = Harness()
    h.running()
    tail = ["Traceback (most recent call last):", "ValueError: shapes do not match"]
    now = h.clock.now
    crashed = [worker(0, exit_code=1, exited_at=now, blame_scope="user_code", log_tail=tail), worker(1, at=now)]
    h.beat("node-0", 1, crashed)
    h.tick()
    h.runner.finish(h.runner.launched[0].key, diagnosis=None)
    h.tick()
    assert h.state().stage is S.RESTARTING and h.state().user_code_failures == 1
    h.tick()  # generation 2 starts; its workers raise the same exception
    assert h.state().generation == 2
    h.beat("node-0", 2, crashed)
    h.beat("node-1", 2, [worker(2, at=now), worker(3, at=now)])
    h.tick()
    h.runner.finish(h.runner.launched[-1].key, diagnosis=None)
    h.tick()
    assert h.state().reason == "UserCodeError" and "shapes do not match" in (h.state().message or "")


# -- machine faults ------------------------------------------------------------------------------
def test_a_machine_fault_evicts_at_once_and_an_ignored_one_is_recorded_once() -> None:
    h = Harness(failurePolicy={"rules": [{"event": "MachineFault", "action": "Ignore"}]})
    h.running()
    h.beat("node-1", 1, [worker(2), worker(3)], machine_faults=["gpu: Xid 79 on GPU 3"])
    h.tick(3)
    [incident] = h.incidents()
    assert incident.action == "ignored (failure policy)" and incident.evidence == ["node-1: gpu: Xid 79 on GPU 3"]
    h.beat("node-1", 1, [worker(2), worker(3)], machine_faults=["gpu: Xid 79 on GPU 3", "disk: / is full"])
    h.tick()
    assert len(h.incidents()) == 2  # a new fault is news


# -- loss spikes ---------------------------------------------------------------------------------
def test_a_loss_spike_rolls_back_past_the_newest_checkpoint() -> None:
    h = Harness()
    h.running()
    for step, loss in enumerate([2.0, 2.1, 1.9, 2.2, 2.0, 12.0], start=31):
        h.run_generation(1, ["node-0", "node-1"], step=step, loss=loss)
        h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "LossSpike" and h.state().resume_max_step == 20
    assert h.state().stage is S.CHECKING  # a rollback runs the stop-time checks first


def test_a_loss_spike_is_judged_on_the_ranks_that_report_a_loss() -> None:
    """Rank 0 reports no loss (a rollout or reward worker, a role listed before the trainer): the
    series is the first rank that reports one."""
    h = Harness()
    h.running()
    for step, loss in enumerate([2.0, 2.1, 1.9, 2.2, 2.0, 12.0], start=31):
        h.beat("node-0", 1, [worker(0, at=h.clock.now, step=step), worker(1, at=h.clock.now, step=step)])
        h.beat("node-1", 1, [worker(r, at=h.clock.now, step=step, loss=loss) for r in (2, 3)])
        h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "LossSpike" and "loss 12 at step 36" in incident.evidence[0]


def test_a_one_step_spike_between_two_heartbeats_is_judged_from_the_peak_the_beat_carries() -> None:
    """The job steps faster than it beats: the beat after the spike carries a normal newest loss and
    the spike as its peak."""
    h = Harness()
    h.running()
    for step, loss in enumerate([2.0, 2.1, 1.9, 2.2, 2.0], start=31):
        h.run_generation(1, ["node-0", "node-1"], step=step, loss=loss, peak_loss=loss + 0.1, peak_loss_step=step - 1)
        h.tick()
    h.run_generation(1, ["node-0", "node-1"], step=40, loss=2.1, peak_loss=30.0, peak_loss_step=38)
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "LossSpike" and "loss 30 at step 38" in incident.evidence[0]


def test_a_peak_already_judged_as_a_newest_loss_is_not_judged_again() -> None:
    """A peak at or before the newest step judged was seen (as that beat's newest or its own peak):
    a baseline that fell since does not make it a spike later."""
    h = Harness()
    h.running()
    for step, loss in enumerate([19.0, 1.0, 0.9, 0.8, 0.7, 0.6, 0.5], start=31):
        h.run_generation(1, ["node-0", "node-1"], step=step, loss=loss, peak_loss=20.0, peak_loss_step=30)
        h.tick()
    assert h.incidents() == []


# -- hangs ---------------------------------------------------------------------------------------
def test_a_hung_rank_is_diagnosed_off_the_loop_and_its_node_evicted() -> None:
    """A Running tick never waits for diagnosis: the capture is launched, the tick returns."""
    h = Harness(faultTolerance={"hangTimeoutFloorSeconds": 5, "hangTimeoutMultiplier": 10})
    h.running()
    h.clock.advance(6)
    h.tick()
    [capture] = h.runner.launched
    assert capture.key[:2] == ("stacks", "hang") and h.state().stage is S.RUNNING
    h.runner.finish(capture.key, diagnosis=Finding(suspects=["node-0"], evidence=["rank 1 is the outlier"]))
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "Hang" and incident.evicted == ["node-0"]
    assert incident.failed_at == h.clock.now - 6 and incident.detected_at == h.clock.now


def test_a_stall_with_no_suspect_is_looked_at_again_then_restarted_after_the_stop_time_checks() -> None:
    h = Harness(faultTolerance={"hangTimeoutFloorSeconds": 5, "hangTimeoutMultiplier": 10})
    h.running()
    h.clock.advance(6)
    h.tick()
    [first] = h.runner.launched
    h.runner.finish(first.key, diagnosis=Finding(suspects=[], evidence=["stacks unusable"]))
    h.tick()
    assert h.incidents() == [] and len(h.runner.launched) == 1  # it waits a timeout before the second look
    h.clock.advance(5.5)
    h.tick()
    second = h.runner.launched[-1]
    assert second.key != first.key
    h.runner.finish(second.key, diagnosis=Finding(suspects=[], evidence=["stacks unusable"]))
    h.tick()
    [incident] = h.incidents()
    # No machine named: the stop-time checks look for one (and count toward a replay if they find none).
    assert incident.failure_class.value == "Hang" and incident.evicted == [] and h.state().stage is S.CHECKING


def test_progress_during_a_capture_ends_the_stall() -> None:
    h = Harness(faultTolerance={"hangTimeoutFloorSeconds": 5, "hangTimeoutMultiplier": 10})
    h.running()
    h.clock.advance(6)
    h.tick()
    [capture] = h.runner.launched
    h.run_generation(1, ["node-0", "node-1"], step=6)  # the job moves again
    h.runner.finish(capture.key, diagnosis=Finding(suspects=["node-0"]))
    h.tick()
    assert h.incidents() == [] and h.state().stage is S.RUNNING


def test_a_late_report_of_older_progress_keeps_the_stall_and_its_capture() -> None:
    """A big job's nodes report over a progress interval: one that tells, after the stall was seen,
    of progress still older than the timeout is the same silence (starting a little later), not the
    job moving again; no second capture is launched."""
    h = Harness(faultTolerance={"hangTimeoutFloorSeconds": 5, "hangTimeoutMultiplier": 10})
    h.running()
    started = h.clock.now
    h.clock.advance(6)
    h.tick()
    [capture] = h.runner.launched
    h.beat("node-1", 1, [worker(r, at=started, last_progress_at=started + 0.5) for r in (2, 3)])
    h.tick()
    assert h.runner.launched == [capture]
    h.runner.finish(capture.key, diagnosis=Finding(suspects=["node-0"]))
    h.tick()
    [incident] = h.incidents()
    assert incident.failed_at == started + 0.5 and incident.detected_at == started + 6


# -- slowdowns -----------------------------------------------------------------------------------
def _pace(h: Harness, step_times: list[float], first_step: int = 1) -> None:
    for i, t in enumerate(step_times):
        h.clock.advance(t)
        h.run_generation(1, ["node-0", "node-1"], step=first_step + i, step_time=t, last_progress_at=h.clock.now)
        h.tick()


def test_a_slowdown_nobody_is_to_blame_for_pauses_then_a_culprit_is_evicted() -> None:
    h = Harness(faultTolerance={"slowdownFactor": 2, "slowdownRounds": 2}, standbys={"count": 1})
    h.running(standbys=["node-2"], next_node_index=3)
    h.join("node-2")
    _pace(h, [0.1] * 8 + [0.5] * 5)
    [rounds] = [w for w in h.runner.launched if w.key[:2] == ("stacks", "slowdown")]
    h.runner.finish(rounds.key, diagnosis=Finding(suspects=[]))
    h.tick()
    assert h.incidents() == []
    _pace(h, [0.5] * 5, first_step=14)  # paused: nothing sampled, nothing asked
    assert len([w for w in h.runner.launched if w.key[0] == "stacks"]) == 1
    h.clock.advance(10)
    _pace(h, [0.5] * 5, first_step=19)
    second = h.runner.launched[-1]
    assert second.key[:2] == ("stacks", "slowdown") and second.key != rounds.key
    h.runner.finish(second.key, diagnosis=Finding(suspects=["node-1"], evidence=["node-1 is waited for"]))
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "Slowdown" and incident.evicted == ["node-1"]
    assert incident.evidence[0].startswith("step time 0.5s, more than 2x")


def test_a_slowdown_that_ends_while_the_rounds_run_evicts_nobody() -> None:
    """A load spike (or a checkpoint's background work) slows every step for a while; by the time
    the rounds are back the pace is what it was: a transient, whatever the rounds name."""
    h = Harness(faultTolerance={"slowdownFactor": 2, "slowdownRounds": 2}, standbys={"count": 1})
    h.running(standbys=["node-2"], next_node_index=3)
    h.join("node-2")
    _pace(h, [0.1] * 8 + [0.5] * 5)
    [rounds] = [w for w in h.runner.launched if w.key[:2] == ("stacks", "slowdown")]
    _pace(h, [0.1] * 5, first_step=14)  # the spike is over
    h.runner.finish(rounds.key, diagnosis=Finding(suspects=["node-1"], evidence=["optimizer_time_s on node-1"]))
    h.tick()
    assert h.incidents() == [] and h.state().stage is S.RUNNING


@pytest.mark.parametrize("rounds", [1, 3])
def test_the_rounds_last_until_the_metrics_can_name_the_slow_node(rounds: int) -> None:
    """Stacks alone often catch nobody: the last round comes METRIC_SAMPLES heartbeats after the
    onset, when the slow rank's own-work times have been out long enough to count fully."""
    h = Harness(faultTolerance={"slowdownFactor": 2, "slowdownRounds": rounds, "heartbeatIntervalSeconds": 0.5})
    h.running()
    _pace(h, [0.1] * 8)
    onset = h.clock.now + 0.5
    _pace(h, [0.5] * 5, first_step=9)
    ready = onset + METRIC_SAMPLES * 0.5
    launched = [w for w in h.runner.launched if w.key[:2] == ("stacks", "slowdown")]
    if rounds == 1:
        assert launched == []  # one round: asked once the metrics can tell
        _pace(h, [0.5] * 12, first_step=14)
        [work] = [w for w in h.runner.launched if w.key[:2] == ("stacks", "slowdown")]
        assert h.clock.now >= ready
    else:
        [work] = launched
        assert work.interval >= 1.5 * 0.5 and h.clock.now + (rounds - 1) * work.interval >= ready - 1e-9


# -- metric outliers -----------------------------------------------------------------------------
def _vectors(h: Harness, step_time: dict[str, float], samples: int) -> None:
    for _ in range(samples):
        h.clock.advance(1)
        for i, (node, t) in enumerate(step_time.items()):
            vector = {
                "node": node,
                "at": h.clock.now,
                "workers_running": 2,
                "step_time_s": t,
                "tokens_per_second": 1 / t,
            }
            h.beat(node, 1, [worker(2 * i), worker(2 * i + 1, last_progress_at=h.clock.now)], vector=vector)
        h.tick()


def test_a_node_whose_own_pace_is_an_outlier_among_its_role_is_evicted() -> None:
    h = Harness(roles=[{"name": "rollout", "replicas": 4, "processesPerNode": 2, "command": ["python", "r.py"]}])
    slots = ("node-0", "node-1", "node-2", "node-3")
    h.running(slots=slots, next_node_index=4)
    _vectors(h, {"node-0": 0.10, "node-1": 0.11, "node-2": 0.10, "node-3": 0.10}, 8)
    assert h.incidents() == []
    _vectors(h, {"node-0": 0.10, "node-1": 0.11, "node-2": 0.35, "node-3": 0.10}, 16)
    [incident] = h.incidents()
    assert incident.failure_class.value == "Slowdown" and incident.suspects == ["node-2"]
    assert incident.evidence[0].startswith("node-2 is a persistent outlier among the 4 rollout nodes")


def _stepping(
    h: Harness, ticks: int, step_at: dict[str, Callable[[int], int | None]], took: Callable[[str, int], float]
) -> None:
    """A heartbeat time every half second: at tick k, each node's agent sends a heartbeat carrying
    the step `step_at` says (None: no heartbeat this time) and the time that step took."""
    for k in range(1, ticks + 1):
        h.clock.advance(0.5)
        for i, (node, at) in enumerate(step_at.items()):
            step = at(k)
            if step is None:
                continue
            t = took(node, step)
            vector = {"node": node, "at": h.clock.now, "step": step, "workers_running": 2, "step_time_s": t}
            vector["tokens_per_second"] = 2 * 128 / t
            ranks = [worker(r, step=step, step_time=t, last_progress_at=h.clock.now) for r in (2 * i, 2 * i + 1)]
            h.beat(node, 1, ranks, vector=vector)
        h.tick()


def test_synchronous_nodes_sampled_at_different_steps_are_no_outliers() -> None:
    """Every node of a synchronous job takes the same time for a step, and the first steps are slow
    (warm-up). node-1's agent, starved on a loaded host, samples every other step only: side by side
    by position its samples reach back to the slow steps while the others' are recent, and it read as
    a node 2.4 times slower (a 3-D job lost two healthy nodes so). By step, they agree."""
    h = Harness(roles=[{"name": "trainer", "replicas": 4, "processesPerNode": 2, "command": ["python", "t.py"]}])
    h.running(slots=("node-0", "node-1", "node-2", "node-3"), next_node_index=4)
    every = {n: (lambda k: k) for n in ("node-0", "node-2", "node-3")}
    starved = {"node-1": lambda k: k if k % 2 == 0 else None}
    _stepping(h, 40, {**every, **starved}, lambda node, step: 0.4 + 3.0 * 0.8**step)
    assert h.incidents() == []


def test_a_node_that_falls_behind_in_steps_is_compared_step_by_step() -> None:
    """Nodes that step on their own (rollouts): node-2 takes three times as long per step, so it is
    at step 13 when the others are at 40; its steps against theirs name it."""
    h = Harness(roles=[{"name": "rollout", "replicas": 4, "processesPerNode": 2, "command": ["python", "r.py"]}])
    h.running(slots=("node-0", "node-1", "node-2", "node-3"), next_node_index=4)
    every = {n: (lambda k: k) for n in ("node-0", "node-1", "node-3")}
    behind = {"node-2": lambda k: k // 3 if k % 3 == 0 else None}  # a step every third tick
    _stepping(h, 40, {**every, **behind}, lambda node, step: (0.3 if node == "node-2" else 0.1) + 0.001 * (step % 3))
    [incident] = h.incidents()
    assert incident.failure_class.value == "Slowdown" and incident.suspects == ["node-2"]
    assert incident.evidence[-1].startswith("median step time over the last 10 samples: node-0 0.10"), incident.evidence


def test_metric_outliers_do_not_act_while_a_rank_has_stopped() -> None:
    """A hang, as the 3-D job's: rank 1 stops; its peers wait in their collectives and every node's
    numbers freeze at its last step, where node-1's step happened to be slower. Frozen samples are
    no measurement, and a stalled rank is the hang detector's case: no metric-outlier incident."""
    h = Harness(roles=[{"name": "rollout", "replicas": 4, "processesPerNode": 2, "command": ["python", "r.py"]}])
    h.running(slots=("node-0", "node-1", "node-2", "node-3"), next_node_index=4)

    def beat(step: int, step_time: dict[str, float], progress_at: float) -> None:
        for i, (node, t) in enumerate(step_time.items()):
            vector = {"node": node, "at": h.clock.now, "step": step, "workers_running": 2, "step_time_s": t}
            ranks = [worker(r, step=step, step_time=t, last_progress_at=progress_at) for r in (2 * i, 2 * i + 1)]
            h.beat(node, 1, ranks, vector=vector)

    pace = {"node-0": 0.10, "node-1": 0.10, "node-2": 0.10, "node-3": 0.10}
    for step in range(1, 11):
        h.clock.advance(0.5)
        beat(step, pace, h.clock.now)
        h.tick()
    hung_at = h.clock.now
    frozen = {**pace, "node-1": 0.14}  # one step's jitter, frozen
    for _ in range(30):
        h.clock.advance(0.5)
        beat(11, frozen, hung_at)
        h.tick()
    assert [i for i in h.incidents() if i.failure_class.value == "Slowdown"] == []
    # The same frozen numbers with fresh progress times (no stall seen): still no new measurement.
    h2 = Harness(roles=[{"name": "rollout", "replicas": 4, "processesPerNode": 2, "command": ["python", "r.py"]}])
    h2.running(slots=("node-0", "node-1", "node-2", "node-3"), next_node_index=4)
    h = h2
    for step in range(1, 11):
        h.clock.advance(0.5)
        beat(step, pace, h.clock.now)
        h.tick()
    for _ in range(30):
        h.clock.advance(0.5)
        beat(11, frozen, h.clock.now)
        h.tick()
    assert h.incidents() == []


def test_metric_outliers_need_three_nodes_of_a_role() -> None:
    h = Harness()
    h.running()
    _vectors(h, {"node-0": 0.1, "node-1": 0.5}, 20)
    assert h.incidents() == []


# -- code updates --------------------------------------------------------------------------------
def test_a_new_code_version_is_applied_at_the_next_restart_or_forced_at_its_deadline() -> None:
    h = Harness(codeVersion="v1")
    h.running(code_version="v1")
    h.set_spec(codeVersion="v2", hotUpdateDeadlineSeconds=60)
    h.tick()
    assert h.state().code_update_seen_at == h.clock.now and h.incidents() == []
    h.clock.advance(61)
    h.run_generation(1, ["node-0", "node-1"], last_progress_at=h.clock.now)
    h.tick()
    [incident] = h.incidents()
    assert incident.failure_class.value == "CodeUpdate" and not incident.counted
    h.tick()
    assert h.state().generation == 2 and h.state().code_version == "v2" and h.state().code_update_seen_at is None
    assignment = h.assignment(2)
    assert assignment is not None and assignment.code_version == "v2"


# -- operator requests ---------------------------------------------------------------------------
def test_requests_cordon_uncordon_and_refuse_unknown_nodes() -> None:
    h = Harness(standbys={"count": 1})
    h.running(standbys=["node-2"], next_node_index=3)
    h.request(RequestKind.CORDON, "node-2", "r1")
    h.tick()
    assert h.request_record("r1").status is RequestStatus.DONE
    assert h.state().standbys == ["node-3"] and "node-2" in h.state().evicted
    h.request(RequestKind.UNCORDON, "node-2", "r2")
    h.tick()
    assert h.request_record("r2").status is RequestStatus.DONE and ("uncordon", "node-2") in h.cluster.calls
    h.request(RequestKind.EVICT, "node-9", "r3")
    h.tick()
    record = h.request_record("r3")
    assert record.status is RequestStatus.FAILED and "node-9" in (record.message or "")


def test_a_check_request_runs_off_the_loop_and_answers_when_done() -> None:
    h = Harness()
    h.running()
    h.cluster.failing["node-1"] = ["all-reduce: wrong result"]
    h.request(RequestKind.CHECK, None)
    h.tick()
    assert h.request_record().status is RequestStatus.PENDING and h.state().stage is S.RUNNING
    h.runner.finish_checks(h.cluster)
    h.tick()
    record = h.request_record()
    assert record.status is RequestStatus.DONE and record.message == "1/2 nodes passed; failed: node-1"


def test_an_eviction_waits_for_the_recovery_under_way() -> None:
    h = Harness()
    h.put_state(stage=S.RESTARTING, generation=1)
    h.request(RequestKind.EVICT, "node-1")
    h.tick()
    assert h.request_record().status is RequestStatus.PENDING


def test_a_request_withdrawn_meanwhile_is_left_alone() -> None:
    """The request's revision guards the commit: a request changed after it was read is not
    answered with stale data."""
    h = Harness()
    h.running()
    h.request(RequestKind.CHECK, "node-0")
    observe = h.controller.observer.observe

    def withdraw_after_reading(*args: object) -> Observation:
        obs = observe(*args)  # type: ignore[arg-type]
        h.store.delete("/stalwart/v1/jobs/unit-job/requests/req-1")
        return obs

    h.tick()
    h.runner.finish_checks(h.cluster)
    h.controller.observer.observe = withdraw_after_reading  # type: ignore[method-assign]
    h.tick()
    assert not h.controller.committed and h.store.get_raw("/stalwart/v1/jobs/unit-job/requests/req-1") is None


def test_the_view_picks_the_running_generation_off_the_heartbeats() -> None:
    h = Harness()
    h.running()
    h.beat("node-1", 0, [worker(2, exit_code=1)])  # an old generation's report: not this one's
    obs = h.controller.observer.observe({}, frozenset())
    assert obs.state is not None
    view = View.of(obs, obs.state)
    assert [w.rank for w in view.workers] == [0, 1] and view.crashed() == []
