"""The status mirror: JobState and incidents in etcd become phase, conditions, restarts, nodes."""

from __future__ import annotations

from stalwart.store.records import FailureClass, Incident, JobPhase, JobState
from stalwart_operator.status import (
    ConditionType,
    NodeState,
    PodView,
    TrainingJobStatus,
    build_status,
)

T0 = 1_800_000_000.0


def state(**changes: object) -> JobState:
    base = JobState(
        job="ml.demo",
        phase=JobPhase.RUNNING,
        generation=1,
        slots=["node-0", "node-1"],
        standbys=["node-2"],
        created_at=T0,
        updated_at=T0,
        started_at=T0 + 5,
        first_step_at=T0 + 10,
        last_step=40,
    )
    return base.model_copy(update=changes)


PODS = {
    n: PodView(name=f"demo-{n}", phase="Running", machine=f"gpu-{i}")
    for i, n in enumerate(["node-0", "node-1", "node-2", "node-3"])
}


def status(
    s: JobState | None,
    previous: TrainingJobStatus | None = None,
    incidents: list[Incident] | None = None,
    suspended: bool = False,
    now: float = T0 + 100,
    registered: set[str] | None = None,
) -> TrainingJobStatus:
    return build_status(
        job_id="ml.demo",
        state=s,
        incidents=incidents or [],
        slot_roles=["trainer", "trainer"],
        pods=PODS,
        registered={"node-0", "node-1", "node-2"} if registered is None else registered,
        previous=previous,
        suspended=suspended,
        observed_generation=1,
        now=now,
    )


def conditions(st: TrainingJobStatus) -> dict[ConditionType, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in st.conditions}


def test_before_the_controller_starts() -> None:
    st = status(None)
    assert st.phase.value == "Created" and st.job_id == "ml.demo"
    assert conditions(st) == {ConditionType.CREATED: ("True", "JobCreated")}


def test_running_job_nodes_and_restarts() -> None:
    st = status(state(restarts=1, infra_restarts=2))
    assert st.phase.value == "Running" and st.current_step == 40 and st.ettr == 1.0
    assert conditions(st)[ConditionType.RUNNING] == ("True", "Running")
    assert ConditionType.SUSPENDED not in conditions(st)  # never suspended: no False entry
    assert (st.restarts.total, st.restarts.infrastructure, st.restarts.counted) == (
        3,
        2,
        1,
    )
    assert [(n.name, n.rank, n.state) for n in st.nodes] == [
        ("node-0", 0, NodeState.RUNNING),
        ("node-1", 1, NodeState.RUNNING),
        ("node-2", None, NodeState.STANDBY),
    ]
    assert st.nodes[1].pod == "demo-node-1" and st.nodes[1].machine == "gpu-1" and st.standbys == ["node-2"]
    assert st.model_dump(by_alias=True)["restarts"] == {
        "total": 3,
        "infrastructure": 2,
        "counted": 1,
    }


def test_restarting_then_recovered_keeps_transition_times() -> None:
    incident = Incident(
        id="inc-1",
        job="ml.demo",
        failure_class=FailureClass.LOST_NODE,
        generation=1,
        node="node-1",
        action="evict node-1 (standby node-2)",
        failed_at=T0 + 50,
        detected_at=T0 + 52,
        counted=False,
    )
    running = status(state())
    restarting = status(
        state(phase=JobPhase.RESTARTING, slots=["node-0", "node-2"], standbys=["node-3"], infra_restarts=1),
        running,
        [incident],
        now=T0 + 53,
    )
    assert restarting.phase.value == "Restarting"
    assert conditions(restarting)[ConditionType.RESTARTING] == ("True", "LostNode")
    assert conditions(restarting)[ConditionType.RUNNING] == ("False", "Restarting")
    assert restarting.last_incident is not None and restarting.last_incident.node == "node-1"
    assert restarting.model_dump(by_alias=True)["lastIncident"]["class"] == "LostNode"
    assert [(n.name, n.rank) for n in restarting.nodes[:2]] == [
        ("node-0", 0),
        ("node-2", 1),
    ]
    recovered = status(
        state(slots=["node-0", "node-2"], standbys=["node-3"], generation=2, infra_restarts=1),
        restarting,
        [incident],
        now=T0 + 60,
        registered={"node-0", "node-2"},
    )
    created = {c.type: c.last_transition_time for c in running.conditions}
    again = {c.type: c for c in recovered.conditions}
    assert again[ConditionType.CREATED].last_transition_time == created[ConditionType.CREATED]
    assert again[ConditionType.RUNNING].status == "True" and again[ConditionType.RESTARTING].status == "False"
    assert again[ConditionType.RUNNING].last_transition_time != created[ConditionType.RUNNING]
    assert recovered.nodes[2].state is NodeState.STARTING  # node-3: pod running, agent not registered yet


def test_finished_and_suspended() -> None:
    done = status(
        state(phase=JobPhase.SUCCEEDED, reason="Completed", message="all 2 workers exited 0", finished_at=T0 + 90)
    )
    assert done.phase.value == "Succeeded" and done.completion_time == "2027-01-15T08:01:30Z"
    assert conditions(done)[ConditionType.SUCCEEDED] == ("True", "Completed")
    assert all(n.state is NodeState.FINISHED for n in done.nodes)
    failed = status(state(phase=JobPhase.FAILED, reason="RestartBudgetExhausted", message="too many"))
    assert conditions(failed)[ConditionType.FAILED] == (
        "True",
        "RestartBudgetExhausted",
    )
    suspended = status(state(), suspended=True)
    assert suspended.phase.value == "Suspended"
    assert conditions(suspended)[ConditionType.SUSPENDED] == ("True", "Suspended")
    resumed = status(state(), previous=suspended)
    assert conditions(resumed)[ConditionType.SUSPENDED] == ("False", "Resumed")


def test_a_lost_pod_shows() -> None:
    pods = dict(PODS)
    pods["node-1"] = PodView(name="demo-node-1", phase="Failed", machine="gpu-1")
    st = build_status(
        job_id="ml.demo",
        state=state(),
        incidents=[],
        slot_roles=["trainer", "trainer"],
        pods=pods,
        registered={"node-0", "node-1", "node-2"},
        previous=None,
        suspended=False,
        observed_generation=1,
        now=T0 + 100,
    )
    assert st.nodes[1].state is NodeState.LOST
