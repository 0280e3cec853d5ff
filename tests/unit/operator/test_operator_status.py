"""The status mirror: JobState and incidents in etcd become phase, conditions, restarts, nodes."""

from __future__ import annotations

import json

from stalwart.store.records import FailureClass, Incident, JobPhase, JobStage, JobState
from stalwart_operator.status import (
    ConditionType,
    NodeState,
    PodView,
    TrainingJobStatus,
    build_status,
)

T0 = 1_800_000_000.0


def state(**changes: object) -> JobState:
    base: dict[str, object] = {
        "job": "ml.demo",
        "phase": JobPhase.RUNNING,  # the phase is derived from the stage: built, not copied over
        "generation": 1,
        "slots": ["node-0", "node-1"],
        "standbys": ["node-2"],
        "created_at": T0,
        "updated_at": T0,
        "started_at": T0 + 5,
        "first_step_at": T0 + 10,
        "last_step": 40,
    }
    return JobState(**{**base, **changes})  # type: ignore[arg-type]


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
    pods: dict[str, PodView] | None = None,
) -> TrainingJobStatus:
    return build_status(
        job_id="ml.demo",
        state=s,
        incidents=incidents or [],
        slot_roles=["trainer", "trainer"],
        pods=PODS if pods is None else pods,
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
    # Every node healthy: counted, none listed.
    assert st.unhealthy_nodes == [] and st.unhealthy_nodes_omitted == 0 and st.nodes_ready == "2/2"
    assert [(c.role, c.slots, c.running, c.starting, c.lost) for c in st.roles] == [("trainer", 2, 2, 0, 0)]
    assert (st.standby_counts.ready, st.standby_counts.starting) == (1, 0) and st.standbys == ["node-2"]
    assert all(c.observed_generation == 1 for c in st.conditions)
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
    assert restarting.nodes_ready == "2/2" and restarting.standby_counts.starting == 1
    assert restarting.last_incident.runbook == "lost_node"
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
    # node-3: pod running, agent not registered yet: a standby still starting, listed.
    [starting] = recovered.unhealthy_nodes
    assert (starting.name, starting.rank, starting.state) == ("node-3", None, NodeState.STARTING)
    assert starting.pod == "demo-node-3" and starting.machine == "gpu-3"
    assert recovered.standby_counts.starting == 1


def test_finished_and_suspended() -> None:
    done = status(
        state(phase=JobPhase.SUCCEEDED, reason="Completed", message="all 2 workers exited 0", finished_at=T0 + 90)
    )
    assert done.phase.value == "Succeeded" and done.completion_time == "2027-01-15T08:01:30Z"
    assert conditions(done)[ConditionType.SUCCEEDED] == ("True", "Completed")
    # What `kubectl wait --for=condition=Complete` waits for, as for a Job, a JobSet or a TrainJob.
    assert conditions(done)[ConditionType.COMPLETE] == ("True", "Succeeded")
    assert done.unhealthy_nodes == [] and done.roles[0].finished == 2
    failed = status(state(phase=JobPhase.FAILED, reason="RestartBudgetExhausted", message="too many"))
    assert ConditionType.COMPLETE not in conditions(failed)  # a failed job never completes
    assert conditions(failed)[ConditionType.FAILED] == (
        "True",
        "RestartBudgetExhausted",
    )
    # spec.suspend set: Suspended at once, but the condition waits until the controller has
    # stopped every pod (what `stalwart suspend` and `kubectl wait` wait for).
    suspending = status(state(stage=JobStage.SUSPENDING), suspended=True)
    assert suspending.phase.value == "Suspended"
    assert ConditionType.SUSPENDED not in conditions(suspending)
    assert conditions(suspending)[ConditionType.RUNNING] == ("False", "Suspending")
    suspended = status(state(stage=JobStage.SUSPENDED), previous=suspending, suspended=True, registered=set(), pods={})
    assert conditions(suspended)[ConditionType.SUSPENDED] == ("True", "Suspended")
    assert suspended.unhealthy_nodes == [] and suspended.roles[0].finished == 2  # stopped, not lost
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
    [lost] = st.unhealthy_nodes
    assert (lost.name, lost.rank, lost.role, lost.state) == ("node-1", 1, "trainer", NodeState.LOST)
    assert st.nodes_ready == "1/2" and st.roles[0].lost == 1


def test_the_status_stays_small_at_ten_thousand_nodes() -> None:
    """10,000 slots, 30 of them lost, 200 nodes evicted so far: counts, 50 listed, a few KiB."""
    slots = [f"node-{i}" for i in range(10_000)]
    standbys = [f"node-{i}" for i in range(10_000, 10_024)]
    pods = {n: PodView(name=f"demo-{n}", phase="Running", machine=f"gpu-{n}") for n in slots + standbys}
    for n in slots[:30]:
        pods[n] = PodView(name=f"demo-{n}", phase="Failed", machine=f"gpu-{n}")
    big = state(slots=slots, standbys=standbys, evicted=[f"old-{i}" for i in range(200)])
    st = build_status(
        job_id="ml.demo",
        state=big,
        incidents=[],
        slot_roles=["trainer"] * 8_000 + ["rollout"] * 2_000,
        pods=pods,
        registered=set(slots + standbys),
        previous=None,
        suspended=False,
        observed_generation=1,
        now=T0 + 100,
    )
    counts = {c.role: c for c in st.roles}
    assert (counts["trainer"].slots, counts["trainer"].lost, counts["trainer"].running) == (8_000, 30, 7_970)
    assert (counts["rollout"].slots, counts["rollout"].running) == (2_000, 2_000)
    assert st.nodes_ready == "9970/10000" and st.standby_counts.ready == 24
    assert len(st.unhealthy_nodes) == 0 + 30 and st.unhealthy_nodes_omitted == 0
    assert st.evicted == [f"old-{i}" for i in range(150, 200)] and st.evicted_count == 200
    assert len(json.dumps(st.to_patch())) < 16_384
    # Every node lost: still 50 listed, the rest counted.
    gone = build_status(
        job_id="ml.demo",
        state=big,
        incidents=[],
        slot_roles=["trainer"] * 10_000,
        pods={},
        registered=set(),
        previous=None,
        suspended=False,
        observed_generation=1,
        now=T0 + 100,
    )
    assert len(gone.unhealthy_nodes) == 50 and gone.unhealthy_nodes_omitted == 10_024 - 50
    assert [n.rank for n in gone.unhealthy_nodes[:3]] == [0, 1, 2]
    assert len(json.dumps(gone.to_patch())) < 16_384


def test_each_role_has_its_own_status() -> None:
    """An RLHF job: each role's slots, its own standby pool, generation, restarts and incidents; the
    Roles column's summary."""
    from stalwart.store.records import RoleState

    roles = {
        "actor": RoleState(
            name="actor", first_slot=0, nodes=1, first_rank=0, world_size=2, restart_scope="Role", generation=2
        ),
        "rollout": RoleState(
            name="rollout",
            first_slot=1,
            nodes=2,
            first_rank=2,
            world_size=2,
            restart_scope="Role",
            generation=3,
            restarted=2,
            infra_restarts=2,
            incidents=["inc-0001", "inc-0003"],
        ),
    }
    s = state(
        slots=["node-0", "node-1", "node-4"],
        standbys=["node-3", "node-5"],
        standby_roles={"node-3": "actor", "node-5": "rollout"},
        roles=roles,
    )
    pods = {
        **PODS,
        "node-4": PodView(name="demo-node-4", phase="Running"),
        "node-5": PodView(name="demo-node-5", phase="Pending"),
    }
    st = build_status(
        job_id="ml.demo",
        state=s,
        incidents=[],
        slot_roles=["actor", "rollout", "rollout"],
        pods=pods,
        registered={"node-0", "node-1", "node-3"},
        previous=None,
        suspended=False,
        observed_generation=1,
        now=T0 + 100,
    )
    by_role = {r.role: r for r in st.roles}
    actor, rollout = by_role["actor"], by_role["rollout"]
    assert (actor.slots, actor.running, actor.generation, actor.restart_scope) == (1, 1, 2, "Role")
    assert (actor.standbys.ready, actor.standbys.starting, actor.incidents, actor.last_incident) == (1, 0, 0, None)
    assert (rollout.slots, rollout.running, rollout.starting) == (2, 1, 1)  # node-4: its agent not registered yet
    assert (rollout.standbys.ready, rollout.standbys.starting) == (0, 1)
    assert (rollout.restarts.restarted, rollout.restarts.infrastructure, rollout.restarts.counted) == (2, 2, 0)
    assert (rollout.incidents, rollout.last_incident, rollout.generation) == (2, "inc-0003", 3)
    assert st.roles_ready == "actor 1/1, rollout 1/2" and st.nodes_ready == "2/3"
    assert (st.standby_counts.ready, st.standby_counts.starting) == (1, 1)
    assert [(n.name, n.role) for n in st.unhealthy_nodes] == [("node-4", "rollout"), ("node-5", "rollout")]
    dumped = st.to_patch()["roles"]
    assert isinstance(dumped, list) and dumped[1]["restartScope"] == "Role" and dumped[1]["lastIncident"] == "inc-0003"
