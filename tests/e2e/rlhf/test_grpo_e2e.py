"""The GRPO example as real processes, each role its own world: it learns, and a failed rollout or
a failed actor rank loses no prompt and trains none twice.

One run (module fixture) carries every assertion: the actor trains 30 steps; at its first steps a
rollout worker is killed while it holds prompt groups and is started again; at step 13 (after the
checkpoint of step 10) an actor rank is killed and the actor's world restarts from that checkpoint,
while the relay, reward, reference and rollout processes keep running; at step 22 the relay is
killed and started again empty, with groups in flight. The actor's ledger says what the final model
trained on; the check compares it, prompt by prompt, with a clean run's order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from statistics import mean

import pytest
from support.rlhf_job import LocalRlhfJob

from stalwart.rlhf.ledger import StartRecord, StepRecord, problems
from stalwart.spec.model import DataPlaneSettings
from stalwart.store.etcd_server import EtcdServer

STEPS = 30
INTERVAL = 5
ACTOR_FAILS_AFTER = 13  # steps 11-13 are trained, then lost with the actor: the restart redoes them
RELAY_FAILS_AFTER = 22
WINDOW = 5
MARGIN = 0.15  # the untrained policy scores ~0.1; by step 30 the policy is past 0.4


@dataclass
class Outcome:
    job: LocalRlhfJob
    steady_pids: dict[str, list[int]]  # roles that no failure touched, before the failures
    rollout_pids_before_actor_failure: list[int]
    pids_before_relay_failure: dict[str, list[int]]
    rollout_groups_held_when_killed: int
    rollout_groups_released: int
    groups_invalidated_by_actor_restart: int


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, etcd: EtcdServer) -> Iterator[Outcome]:
    job = LocalRlhfJob(
        tmp_path_factory.mktemp("grpo"),
        etcd.endpoint,
        job="grpo-e2e",
        steps=STEPS,
        rollouts=2,
        checkpoint_interval=INTERVAL,
        settings=DataPlaneSettings(max_weight_staleness=1, relay_capacity=64, lease_seconds=60),
        hold_at=8,
    )
    try:
        job.start()
        steady = {role: job.pids(role) for role in ("reward", "reference")}
        # A rollout worker dies with prompt groups in hand; its groups go back and are made again.
        job.wait_for("the actor's first step", lambda: len(job.history()) >= 1)
        held = job.catch_holding("rollout", 1)
        job.kill("rollout", 1)
        job.wait_for(
            "the relay to take back the dead rollout's groups",
            lambda: job.relay_stats()["counts"].get("released.rollout", 0) >= held,
        )
        released = int(job.relay_stats()["counts"]["released.rollout"])
        job.restart_worker("rollout", 1)

        # An actor rank dies three steps after a checkpoint, with groups made from its newest weights
        # ready in the relay: the restarted actor resumes at the checkpoint and those groups are redone.
        job.hold(max(ACTOR_FAILS_AFTER, (job.hold_at or 0) + 1))
        job.wait_for("the actor to reach its hold", lambda: len(job.history()) >= (job.hold_at or 0))
        job.wait_for("look-ahead groups ready", lambda: job.relay_stats()["held"].get("ready", 0) >= 8)
        rollout_pids = job.pids("rollout")
        job.kill("actor", 1)
        job.restart_actor()
        job.wait_for("the restarted actor's start", lambda: len(starts(job)) == 2)
        # The actor records its start before it resumes at the relay: wait for the resume's effect.
        job.wait_for(
            "the relay to refuse the groups made from the lost incarnation's weights",
            lambda: job.relay_stats()["counts"].get("invalidated", 0) >= 1,
        )
        invalidated = int(job.relay_stats()["counts"]["invalidated"])

        # The relay dies with groups in every stage; a new one starts empty and the roles find it.
        job.hold(RELAY_FAILS_AFTER)
        job.wait_for("the actor to reach its hold", lambda: len(job.history()) >= RELAY_FAILS_AFTER)
        before = {role: job.pids(role) for role in ("relay", "actor", "rollout", "reward", "reference")}
        job.kill("relay", 0)
        job.restart_worker("relay", 0)
        job.hold(None)
        job.wait_finished()
        yield Outcome(
            job=job,
            steady_pids=steady,
            rollout_pids_before_actor_failure=rollout_pids,
            pids_before_relay_failure=before,
            rollout_groups_held_when_killed=held,
            rollout_groups_released=released,
            groups_invalidated_by_actor_restart=invalidated,
        )
    finally:
        job.stop()


def starts(job: LocalRlhfJob) -> list[StartRecord]:
    return [r for r in job.records() if isinstance(r, StartRecord)]


def test_every_prompt_is_trained_on_exactly_once_across_every_failure(run: Outcome) -> None:
    records = run.job.records()
    assert problems(records) == []
    assert [r.step for r in run.job.history()] == list(range(1, STEPS + 1))
    redone = sum(1 for r in records if isinstance(r, StepRecord)) - STEPS
    assert redone >= 1, "the actor failed after its checkpoint: some steps must have been trained again"


def test_a_dead_rollouts_groups_are_generated_again(run: Outcome) -> None:
    assert run.rollout_groups_held_when_killed >= 1
    assert run.rollout_groups_released >= run.rollout_groups_held_when_killed
    assert run.job.restarts == {"rollout": 1, "actor": 1, "relay": 1}


def test_the_actor_restarts_from_its_checkpoint_while_other_roles_keep_their_processes(run: Outcome) -> None:
    first, second = starts(run.job)
    assert first.base_step == 0
    assert 0 < second.base_step < ACTOR_FAILS_AFTER and second.base_step % INTERVAL == 0
    assert second.incarnation != first.incarnation
    for role, pids in run.steady_pids.items():
        assert run.job.pids(role) == pids, f"{role} was restarted"
    assert run.job.pids("rollout") == run.rollout_pids_before_actor_failure
    # Groups made from the lost incarnation's newest weights were refused, and made again.
    assert run.groups_invalidated_by_actor_restart >= 1


def test_a_new_relay_takes_over_while_every_other_role_keeps_its_processes(run: Outcome) -> None:
    before = dict(run.pids_before_relay_failure)
    assert run.job.pids("relay") != before.pop("relay")
    for role, pids in before.items():
        assert run.job.pids(role) == pids, f"{role} was restarted with the relay"
    incarnations = {r.incarnation for r in run.job.history()[RELAY_FAILS_AFTER:]}
    assert len(incarnations) == 1, "the actor went on after the relay's restart, without restarting"


def test_the_policy_learns(run: Outcome) -> None:
    rewards = [r.reward for r in run.job.history()]
    untrained, trained = mean(rewards[:WINDOW]), mean(rewards[-WINDOW:])
    assert trained > untrained + MARGIN, f"reward {untrained:.3f} -> {trained:.3f}: {rewards}"


def test_every_role_finished_cleanly(run: Outcome) -> None:
    names = ("relay-0", "reward-0", "reference-0", "rollout-0", "rollout-1", "actor-0", "actor-1")
    exits = {f"{e.role}-{e.rank}": e.proc.returncode for e in run.job.procs.values()}
    assert exits == dict.fromkeys(names, 0)
