"""Fault specs: worker faults reach the workers through their agents' environment (every node, the
standbys too), and a bad node's crash rides with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.controller_harness import spec_document

from stalwart import worker_contract as contract
from stalwart.faults import FaultKind, node_fault_env, parse_fault
from stalwart.faults.injector import FaultInjector
from stalwart.spec import parse_job
from stalwart.store.records import Heartbeat, JobStage, JobState, WorkerState, WorkerStatus


def test_slow_data_needs_a_rank_and_may_say_how_slow() -> None:
    fault = parse_fault("slow-data:rank=5,step=10,seconds=1.5")
    assert fault.kind is FaultKind.SLOW_DATA and fault.describe() == "slow-data rank=5 +1.5s at step 10"
    armed = json.loads(node_fault_env([fault])["*"][contract.FAULT_HOOKS])
    assert armed["slow_data_seconds"] == 1.5 and armed["slow_step_seconds"] == 0.4
    try:
        parse_fault("slow-data:step=10")
    except ValueError as exc:
        assert "slow-data needs rank=" in str(exc)
    else:
        raise AssertionError("a slow-data fault without a rank was accepted")


def test_worker_faults_arm_every_node_and_a_bad_node_also_crashes() -> None:
    env = node_fault_env([parse_fault("hang-worker:rank=1,step=20"), parse_fault("bad-node:node=1")])
    assert set(env) == {"*", "node-1"}
    armed = json.loads(env["*"][contract.FAULT_HOOKS])
    assert armed["signals"] is True and armed["crash_after_steps"] is None
    crashing = json.loads(env["node-1"][contract.FAULT_HOOKS])
    assert crashing["signals"] is True and crashing["crash_after_steps"] == 5
    assert node_fault_env([parse_fault("kill-worker:rank=1,step=3")]) == {}  # a SIGKILL needs no hook


def test_etcd_faults_act_only_on_the_etcd_the_run_starts(tmp_path: Path) -> None:
    """`--inject pause-etcd` and `kill-etcd` say how long etcd is away; with `--etcd` (someone
    else's etcd) they are refused before anything starts. `--etcd-outage` sets the job's limit, for
    the runner, the controller and the agents alike."""
    from stalwart.runner.local_run import LocalRun

    pause, kill = parse_fault("pause-etcd:step=20,seconds=10"), parse_fault("kill-etcd:step=30")
    assert pause.describe() == "pause-etcd +10s at step 20" and kill.describe() == "kill-etcd at step 30"
    assert pause.kind.on_etcd and kill.kind.on_etcd and not parse_fault("kill-controller").kind.on_etcd
    job = parse_job(spec_document(), "test")
    assert job.spec.fault_tolerance.etcd_outage_seconds == 60
    run = LocalRun(job, tmp_path / "job.yaml", tmp_path / "run", faults=[pause], etcd_outage_seconds=30)
    assert run.job.spec.fault_tolerance.etcd_outage_seconds == 30
    with pytest.raises(ValueError, match="leave out --etcd"):
        LocalRun(job, tmp_path / "job.yaml", tmp_path / "run", etcd_endpoint="127.0.0.1:2379", faults=[kill])


def test_a_fault_after_recovery_waits_until_the_faults_before_it_were_handled_and_closed() -> None:
    """Steps may run faster than a failure is detected: such a fault must not land in the previous
    one's recovery, whatever step the job reached meanwhile."""
    killed: list[str] = []

    class Cluster:
        job = "j"

        def kill_node(self, node: str) -> list[int]:
            killed.append(node)
            return [1]

    faults = [parse_fault("kill-node:node=0,step=2"), parse_fault("kill-node:node=1,step=3,after=recovery")]
    assert faults[1].describe().endswith("at step 3 after recovery")
    injector = FaultInjector(faults, Cluster(), lambda: None)  # type: ignore[arg-type]
    state = JobState(job="j", stage=JobStage.RUNNING, slots=["node-0", "node-1"], created_at=0.0, updated_at=0.0)
    worker = WorkerStatus(local_rank=0, rank=0, pid=1, state=WorkerState.RUNNING, started_at=0.0, step=9)
    beats = {"node-1": Heartbeat(node="node-1", generation=0, sent_at=0.0, workers=[worker])}

    assert [f.target for f in injector.poll(state, beats)] == ["node-0 (1 processes)"]  # step 9: both due
    assert injector.poll(state, beats) == [] and killed == ["node-0"]  # not handled yet
    handling = state.model_copy(update={"infra_restarts": 1, "open_incident": "i1", "restarting_roles": ["a"]})
    assert injector.poll(handling, beats) == []  # handled, still recovering
    recovered = handling.model_copy(update={"open_incident": None, "restarting_roles": []})
    assert len(injector.poll(recovered, beats)) == 1 and killed == ["node-0", "node-1"]
