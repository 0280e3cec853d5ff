"""The failure ladder's decisions and the standby pool's size: pure functions, shared with the simulator."""

from __future__ import annotations

import pytest

from stalwart.controller.core.policy import (
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
from stalwart.controller.core.standbys import binomial_quantile, standby_count, standbys_for
from stalwart.spec.model import FailureAction, FailureEvent, FailurePolicy, FailurePolicyRule, StandbySettings
from stalwart.store.records import WorkerState, WorkerStatus


@pytest.mark.parametrize(("nodes", "standbys"), [(128, 2), (192, 2), (256, 2), (1024, 4)])
def test_standby_count_matches_byterobusts_table(nodes: int, standbys: int) -> None:
    assert standby_count(nodes, 0.0012) == standbys


def test_standby_count_grows_with_nodes_and_failure_rate() -> None:
    sizes = [standby_count(n, 0.0012) for n in (8, 64, 512, 4096, 16384)]
    assert sizes == sorted(sizes) and sizes[0] == 0
    assert standby_count(1024, 0.01) > standby_count(1024, 0.0012)
    assert binomial_quantile(10, 1.0, 0.99) == 10 and binomial_quantile(10, 0.0, 0.99) == 0
    with pytest.raises(ValueError):
        binomial_quantile(10, 1.5, 0.99)


def test_standbys_for_takes_the_count_else_the_binomial_size_with_a_floor() -> None:
    assert standbys_for(StandbySettings(count=7), 2) == 7
    assert standbys_for(StandbySettings(), 2) == 1  # the minimum
    assert standbys_for(StandbySettings(minimum=0), 2) == 0
    assert standbys_for(StandbySettings(), 1024) == 4


def worker(
    rank: int, cls: str | None, scope: str | None, exit_code: int = 1, tail: list[str] | None = None
) -> WorkerStatus:
    return WorkerStatus(
        local_rank=rank % 2,
        rank=rank,
        pid=100 + rank,
        state=WorkerState.EXITED,
        exit_code=exit_code,
        started_at=0,
        exited_at=float(rank),
        failure_class=cls,
        blame_scope=scope,
        failure_reason=cls,
        log_tail=tail or [],
    )


def test_a_machine_signature_names_its_node_even_among_victims() -> None:
    c = classify_crash([("node-0", worker(0, "peer_closed", "job")), ("node-1", worker(2, "xid", "node"))])
    assert c.event is FailureEvent.MACHINE_FAULT and c.suspects == ["node-1"] and c.runbook == "xid"


def test_a_python_exception_at_the_root_is_user_code_not_a_machine() -> None:
    crashed = [
        (f"node-{r // 2}", worker(r, "python_exception", "user_code", tail=["ValueError: bad"])) for r in range(4)
    ]
    c = classify_crash(crashed)
    assert c.event is FailureEvent.USER_CODE_ERROR and c.suspects == [] and "ValueError: bad" in c.evidence


def test_a_killed_worker_with_victims_is_a_plain_crash() -> None:
    c = classify_crash(
        [("node-0", worker(1, None, None, exit_code=-9)), ("node-1", worker(2, "python_exception", "user_code"))]
    )
    assert c.event is FailureEvent.WORKER_CRASH and c.rank == 1 and c.exit_code == -9


def test_nan_is_the_jobs_and_rolls_back_with_checks() -> None:
    c = classify_crash([("node-0", worker(0, "nan_loss", "job"))])
    d = decide(c, FailurePolicy(), Counters())
    assert d.event is FailureEvent.NAN_LOSS and d.action is FailureAction.ROLLBACK and d.stop_time_checks
    assert d.counted


def test_user_code_is_retried_once_then_fails_with_user_code_error() -> None:
    policy, c = FailurePolicy(), Classified(FailureEvent.USER_CODE_ERROR)
    first = decide(c, policy, Counters())
    assert first.action is FailureAction.RESTART
    counters = count(Counters(), first)
    assert counters == Counters(restarts=1, user_code_failures=1)
    second = decide(c, policy, counters)
    assert second.action is FailureAction.FAIL and second.reason == "UserCodeError"


def test_infrastructure_failures_do_not_spend_the_budget() -> None:
    policy = FailurePolicy(max_restarts=0)
    d = decide(Classified(FailureEvent.LOST_NODE, ["node-1"]), policy, Counters(restarts=5))
    assert d.action is FailureAction.EVICT and not d.counted and d.suspects == ["node-1"]
    assert count(Counters(), d) == Counters()
    crash = decide(Classified(FailureEvent.WORKER_CRASH), policy, Counters())
    assert crash.action is FailureAction.FAIL and crash.reason == "RestartBudgetExhausted"


def test_evict_without_a_suspect_restarts_with_checks_and_rules_override_the_ladder() -> None:
    d = decide(Classified(FailureEvent.HANG, []), FailurePolicy(), Counters())
    assert d.action is FailureAction.RESTART and d.stop_time_checks  # the checks look for the culprit
    assert not decide(
        Classified(FailureEvent.HANG, []), FailurePolicy(), Counters(), checks_enabled=False
    ).stop_time_checks
    named = decide(Classified(FailureEvent.HANG, ["node-1"]), FailurePolicy(), Counters())
    assert named.action is FailureAction.EVICT and not named.stop_time_checks
    policy = FailurePolicy(rules=[FailurePolicyRule(event=FailureEvent.SLOWDOWN, action=FailureAction.IGNORE)])
    assert decide(Classified(FailureEvent.SLOWDOWN, ["node-3"]), policy, Counters()).action is FailureAction.IGNORE
    with pytest.raises(ValueError, match="more than one rule"):
        FailurePolicy(rules=[FailurePolicyRule(event=FailureEvent.HANG, action=FailureAction.FAIL)] * 2)


def test_hang_timeout_is_a_multiple_of_the_step_time_with_a_floor() -> None:
    assert hang_timeout([0.5, 0.6, 100.0], multiplier=10, floor=3) == pytest.approx(6.0)  # the median, not the outlier
    assert hang_timeout([0.01], multiplier=10, floor=3) == 3
    assert hang_timeout([], multiplier=10, floor=60) == 60


def test_slowdown_onset_is_the_start_of_the_trailing_slow_run() -> None:
    warmup = [(0.0, 5.0), (1.0, 5.0)]  # the first steps are slow, and do not count
    baseline = [(float(t), 0.10 + 0.01 * (t % 3)) for t in range(2, 8)]
    slow = [(float(t), 0.45) for t in range(8, 14)]
    assert slowdown_onset(warmup + baseline + slow, factor=2.0) == 8.0
    # One slow step in the recent window is noise, not a slowdown.
    noisy = warmup + baseline + [(8.0, 0.1), (9.0, 0.1), (10.0, 0.9), (11.0, 0.1), (12.0, 0.1)]
    assert slowdown_onset(noisy, factor=2.0) is None
    # Too few samples to know the pace yet; a factor within the noise never fires.
    assert slowdown_onset(warmup + baseline[:3] + slow[:5], factor=2.0) is None
    assert slowdown_onset(warmup + baseline + slow, factor=5.0) is None
    # A slowdown that lasts long enough becomes the new baseline: it was acted on by then.
    assert slowdown_onset(warmup + baseline + slow * 3, factor=2.0) is None


def test_loss_spike_needs_history_and_a_finite_loss() -> None:
    history = [2.0] * 10
    assert is_loss_spike(11.0, history, 5.0) and not is_loss_spike(9.0, history, 5.0)
    assert not is_loss_spike(float("nan"), history, 5.0) and not is_loss_spike(50.0, history[:2], 5.0)


def test_a_nic_must_go_down_twice_in_the_window_other_faults_evict_at_once() -> None:
    nics: dict[str, NicHistory] = {}
    nic = {"node-1": ["network: eth1 is down"]}
    kw = {"nic_count": 2, "nic_window": 300.0}
    assert machine_fault_suspects(nic, nics, 0.0, **kw) == {}
    assert machine_fault_suspects(nic, nics, 1.0, **kw) == {}  # still the same outage
    assert machine_fault_suspects({}, nics, 2.0, **kw) == {}  # back up
    evicted = machine_fault_suspects(nic, nics, 3.0, **kw)  # down again: the second time
    assert list(evicted) == ["node-1"] and "2 times" in evicted["node-1"][0]
    assert machine_fault_suspects({}, {}, 0.0, **kw) == {}
    xid = machine_fault_suspects({"node-2": ["gpu: Xid 79 on GPU 3"]}, {}, 0.0, **kw)
    assert xid == {"node-2": ["gpu: Xid 79 on GPU 3"]}
    assert machine_fault_suspects(nic, {"node-1": NicHistory(downs=[-400.0])}, 0.0, **kw) == {}  # outside the window


def test_replay_of_a_data_parallel_job_runs_each_node_alone_and_names_the_one_that_failed() -> None:
    from stalwart.controller.core.replay import WHOLE_JOB, conclusion
    from stalwart.controller.core.replay import plan_phases as plan
    from stalwart.spec import Role, TrainingJobSpec

    spec = TrainingJobSpec(roles=[Role(name="trainer", replicas=3, processes_per_node=2, command=["python"])])
    replay = plan(spec, ["node-0", "node-1", "node-2"])
    # PP = 1: the horizontal group is the whole job, which has just failed; it is not run again.
    assert [g.nodes for g in replay.vertical] == [["node-0"], ["node-1"], ["node-2"]]
    assert [(g.outcome, g.reason) for g in replay.horizontal] == [("failed", WHOLE_JOB)]
    for group, outcome in zip(replay.vertical, ["passed", "failed", "passed"], strict=True):
        group.outcome = outcome  # type: ignore[assignment]
    node, summary = conclusion(replay)
    assert node == "node-1" and "node-1 is in both" in summary
    replay.vertical[2].outcome = "failed"  # two failing groups: no single machine to blame
    node, summary = conclusion(replay)
    assert node is None and "inconclusive" in summary
