"""Multi-role jobs: each role its own world, and `restartScope: Role` restarting one role alone while
the others' nodes get no command (their workers keep their pids); `Job` as the contrast."""

from __future__ import annotations

from typing import Any

import pytest
from support.controller_harness import Harness, worker

from stalwart.controller.core.work import NodeChecks

ACTOR, ROLLOUT_A, ROLLOUT_B, STANDBY = "node-0", "node-1", "node-2", "node-3"


def rlhf_job(scope: str) -> Harness:
    roles: list[dict[str, Any]] = [
        {"name": "actor", "processesPerNode": 2, "command": ["python", "actor.py"], "restartScope": scope},
        {"name": "rollout", "replicas": 2, "command": ["python", "rollout.py"], "restartScope": scope, "standbys": 1},
    ]
    h = Harness(roles=roles)
    h.tick()  # the job's first state: slots and the rollout's standby
    h.join(ACTOR, ROLLOUT_A, ROLLOUT_B, STANDBY)
    h.tick(3)
    assert h.state().stage.value == "Running"
    step(h, 1)
    return h


def step(h: Harness, generation_of: int, nodes: tuple[str, ...] = (ACTOR, ROLLOUT_A, ROLLOUT_B)) -> None:
    ranks = {ACTOR: [0, 1], ROLLOUT_A: [2], ROLLOUT_B: [3], STANDBY: [3]}
    state = h.state()
    for node in nodes:
        h.beat(
            node,
            state.running_generation(node),
            [worker(r, at=h.clock.now, first_step_at=h.clock.now - 40, first_step=1) for r in ranks[node]],
        )


def test_each_role_is_its_own_world_with_its_own_standbys() -> None:
    h = rlhf_job("Role")
    state = h.state()
    assert state.slots == [ACTOR, ROLLOUT_A, ROLLOUT_B] and state.standby_roles == {STANDBY: "rollout"}
    assignment = h.assignment(1)
    assert assignment is not None
    actor, a, b = (assignment.for_node(n) for n in (ACTOR, ROLLOUT_A, ROLLOUT_B))
    assert actor and a and b
    assert (actor.role_first_rank, actor.world_size, actor.first_rank) == (0, 2, 0)
    assert (a.role_first_rank, a.role_node_rank, a.world_size, a.first_rank) == (0, 0, 2, 2)
    assert (b.role_first_rank, b.role_node_rank, b.world_size, b.first_rank) == (1, 1, 2, 3)
    assert (a.master_addr, a.master_port) == (b.master_addr, b.master_port)
    assert {r: s.generation for r, s in state.roles.items()} == {"actor": 1, "rollout": 1}


def test_a_lost_rollout_node_restarts_the_rollout_role_alone_through_its_standby() -> None:
    h = rlhf_job("Role")
    h.lapse(ROLLOUT_B)
    h.tick()
    state = h.state()
    (incident,) = h.incidents()
    assert incident.role == "rollout" and incident.scope == "Role" and incident.counted is False
    assert incident.replacements == {ROLLOUT_B: STANDBY}
    assert state.restarting_roles == ["rollout"]
    assert h.command(ACTOR) == (1, "run"), "the actor's node got a command"
    assert h.command(ROLLOUT_A) == (1, "stop")
    h.tick(3)
    state = h.state()
    assert state.stage.value == "Running" and state.generation == 2
    assert h.command(ACTOR) == (1, "run") and h.command(ROLLOUT_A) == (2, "run") and h.command(STANDBY) == (2, "run")
    assert {r: s.generation for r, s in state.roles.items()} == {"actor": 1, "rollout": 2}
    assert state.restarts == 0 and state.roles["rollout"].infra_restarts == 1
    new = h.assignment(2)
    assert new is not None and new.for_node(STANDBY).role_first_rank == 1  # type: ignore[union-attr]
    # The actor's workers of generation 1 still count: the job recovers at the actor's next step.
    h.clock.advance(1)
    step(h, 2, (ACTOR, ROLLOUT_A, STANDBY))
    h.tick()
    (incident,) = h.incidents()
    assert incident.first_step_at is not None and h.state().open_incident is None


@pytest.mark.parametrize("scope", ["Job"])
def test_restart_scope_job_restarts_every_role(scope: str) -> None:
    h = rlhf_job(scope)
    h.lapse(ROLLOUT_B)
    h.tick()
    (incident,) = h.incidents()
    assert incident.scope == "Job" and h.command(ACTOR) == (1, "stop")
    h.tick(3)
    state = h.state()
    assert h.command(ACTOR) == (2, "run")
    assert {r: s.generation for r, s in state.roles.items()} == {"actor": 2, "rollout": 2}


def test_a_crashed_actor_rank_restarts_the_actor_alone_after_checks_on_its_node() -> None:
    h = rlhf_job("Role")
    step(h, 1, (ROLLOUT_A, ROLLOUT_B))
    h.beat(ACTOR, 1, [worker(0), worker(1, exit_code=-9, exited_at=h.clock.now)])
    h.tick()
    h.runner.finish(next(w for w in h.runner.launched if w.key[0] == "crash").key, diagnosis=None)
    h.tick()
    crash = next(i for i in h.incidents() if i.failure_class.value == "WorkerCrash")
    assert crash.role == "actor" and crash.scope == "Role" and crash.counted
    assert h.command(ROLLOUT_A) == (1, "run") and h.command(ROLLOUT_B) == (1, "run")
    assert h.command(ACTOR) == (1, "stop") and h.state().stage.value == "StopTimeChecks"
    h.beat(ACTOR, 1, [worker(0, exit_code=-15, exited_at=h.clock.now), worker(1, exit_code=-9, exited_at=h.clock.now)])
    h.tick()  # the actor's workers stopped; the rollouts' never were asked to
    (checks,) = [w for w in h.runner.launched if isinstance(w, NodeChecks) and w.purpose == "stop-time"]
    assert checks.nodes == (ACTOR,)  # the actor's node alone: the rollouts keep running


def test_a_role_whose_failures_nothing_explains_is_replayed_alone_on_its_own_nodes() -> None:
    """Dual-phase replay within the failed role: its nodes run as smaller copies of the role (its
    own layout), the other role's node keeps its command throughout, and the faulty node the two
    phases share is evicted and replaced by the role's own standby."""
    trainer_a, trainer_b, evaluator, standby = "node-0", "node-1", "node-2", "node-3"
    roles: list[dict[str, Any]] = [
        {"name": "trainer", "replicas": 2, "processesPerNode": 2, "command": ["python", "t.py"], "standbys": 1},
        {"name": "evaluator", "command": ["python", "e.py"]},
    ]
    roles = [{**r, "restartScope": "Role"} for r in roles]
    h = Harness(roles=roles, failurePolicy={"replayAfter": 1})
    h.tick()
    h.join(trainer_a, trainer_b, evaluator, standby)
    h.tick(3)
    ranks = {trainer_a: [0, 1], trainer_b: [2, 3], evaluator: [4]}
    for node, rs in ranks.items():
        h.beat(node, 1, [worker(r, at=h.clock.now, first_step_at=h.clock.now - 40, first_step=1) for r in rs])
    h.beat(trainer_b, 1, [worker(2), worker(3, exit_code=-9, exited_at=h.clock.now)])
    h.tick()
    h.runner.finish(next(w for w in h.runner.launched if w.key[0] == "crash").key, diagnosis=None)
    h.tick()
    h.beat(trainer_b, 1, [worker(2, exit_code=-15, exited_at=h.clock.now), worker(3, exit_code=-9)])
    h.beat(trainer_a, 1, [worker(0, exit_code=-15, exited_at=h.clock.now), worker(1, exit_code=-15)])
    h.tick()
    (checks,) = [w for w in h.runner.launched if isinstance(w, NodeChecks) and w.purpose == "stop-time"]
    assert set(checks.nodes) == {trainer_a, trainer_b}
    h.runner.finish_checks(h.cluster)  # every check passes: nothing explains the crash
    h.tick()
    state = h.state()
    assert state.replay is not None and state.replay.role == "trainer"
    assert state.roles["trainer"].unexplained_failures == 1 and state.unexplained_failures == 0
    assert [g.nodes for g in state.replay.vertical] == [[trainer_a], [trainer_b]]
    h.tick()  # the vertical phase starts: each trainer node alone, the role's layout at DP 2
    state = h.state()
    gen = state.generation
    assert gen == 2 and state.stage.value == "ReplayVertical"
    phase = h.assignment(gen)
    assert phase is not None and {n.node for n in phase.nodes} == {trainer_a, trainer_b}
    alone = phase.for_node(trainer_b)
    assert alone is not None and (alone.role, alone.first_rank, alone.world_size) == ("trainer", 0, 2)
    assert h.command(trainer_a) == (gen, "run") and h.command(trainer_b) == (gen, "run")
    assert h.command(evaluator) == (1, "run"), "the evaluator's node got a command"
    h.beat(trainer_a, gen, [worker(i, exit_code=0) for i in range(2)])
    h.beat(trainer_b, gen, [worker(i, exit_code=134) for i in range(2)])
    h.tick()
    state = h.state()
    assert state.replay is None and state.evicted == [trainer_b] and state.roles["trainer"].unexplained_failures == 0
    (incident,) = h.incidents()
    assert "dual-phase replay found node-1" in incident.action and incident.scope == "Role"
    h.tick(3)
    state = h.state()
    assert state.stage.value == "Running" and state.slots == [trainer_a, standby, evaluator]
    assert h.command(standby) == (state.generation, "run") and h.command(evaluator) == (1, "run")
    assert {r: s.generation for r, s in state.roles.items()} == {"trainer": 2, "evaluator": 1}


def test_a_role_on_the_data_plane_is_not_replayed() -> None:
    from stalwart.controller.core.replay import replayable
    from stalwart.spec import TrainingJobSpec

    roles = [
        {"name": "actor", "replicas": 2, "command": ["python", "a.py"], "restartScope": "Role"},
        {"name": "rollout", "replicas": 2, "command": ["python", "r.py"], "restartScope": "Role"},
    ]
    spec = TrainingJobSpec.model_validate({"roles": roles})
    slots = ["n0", "n1", "n2", "n3"]
    assert replayable(spec, slots, "rollout") is None
    assert "stay in one role" in (replayable(spec, slots) or "")
    with_plane = TrainingJobSpec.model_validate({"roles": roles, "dataPlane": {}})
    assert "live data plane" in (replayable(with_plane, slots, "actor") or "")
