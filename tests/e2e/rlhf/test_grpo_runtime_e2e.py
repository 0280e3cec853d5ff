"""The GRPO example under the real runtime (`stalwart run`), every role its own world, with role-scoped
recovery; and the same job with `restartScope: Job` as the contrast.

One role-scoped run (module fixture) carries every Role assertion. The slots are relay (node-0),
actor (node-1, 2 ranks: job-wide ranks 1-2), rollout (node-2, node-3: ranks 3-4), reward (node-4:
rank 5), reference (node-5: rank 6), and one rollout standby (node-6). The faults come early, one
after another, each at a step the job reached:
- step 2: the second rollout node dies (kill-node): its standby takes its place, only the rollout role
  restarts, nothing counts against maxRestarts;
- then (checkpoints every 3 steps) actor rank 1 is SIGKILLed: the actor role restarts from its newest
  checkpoint while every other role keeps its processes;
- then the reward worker hangs holding prompt groups: the relay takes them back after `leaseSeconds`
  and says so; the controller names the reward node, evicts it, and restarts the reward role alone;
- then the relay's node dies: a new relay starts empty on a new node, every client finds it through
  etcd, the actor tells it where it is, and the other roles keep their processes.
Each fault after the first waits until the job recovered from the one before (`after=recovery`).
The actor's ledger then shows every prompt trained on exactly once across all of it, and the policy
learns (60 steps).

The `restartScope: Job` run is short (16 steps, one rollout node killed at step 2, one rollout
replica): every role's pids change and the actor restarts from its checkpoint.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import pytest
import yaml
from support.paths import REPO
from support.stalwart_run import run_job

from stalwart.rlhf.ledger import FinishRecord, StartRecord, StepRecord, history, problems, read

GRPO = REPO / "examples" / "rlhf" / "grpo.yaml"
STEPS = 60  # four recoveries one after another: a shorter run ended before the last faults' turn
INTERVAL = 3
LEASE_SECONDS = 20  # long enough that no healthy worker under load loses its lease
# Steps go faster than a failure is detected: each fault after the first waits for the job to have
# recovered from the one before (`after=recovery`), so no recovery overlaps another.
FAULTS = (
    "kill-node:node=3,step=2",  # the second rollout node
    "kill-worker:rank=2,step=4,after=recovery",  # actor rank 1 (job-wide rank 2), after a checkpoint
    "hang-worker:rank=5,step=4,after=recovery",  # the reward worker
    "kill-node:node=0,step=4,after=recovery",  # the relay
)
JOB_STEPS = 16  # a fault lands some steps after its step: a shorter run could end first
pytestmark = pytest.mark.timeout(1200)  # a run of the example starts 7 torch processes on a shared machine
STALWART = [sys.executable, "-m", "stalwart.cli.main"]  # (the conftest's stalwart_cmd is per test)
WINDOW = 5
MARGIN = 0.15  # the untrained policy scores ~0.1


def grpo_variant(tmp_path: Path, *, steps: int, scope: str, interval: int, rollouts: int = 2) -> Path:
    doc = yaml.safe_load(GRPO.read_text())
    spec = doc["spec"]
    for role in spec["roles"]:
        role["workingDir"] = str(GRPO.parent)
        role["restartScope"] = scope
        if role["name"] == "actor":
            role["command"] = ["python", "actor.py", "--steps", str(steps), "--checkpoint-interval", str(interval)]
        if role["name"] == "rollout":
            role["replicas"] = rollouts
    spec["dataPlane"]["leaseSeconds"] = LEASE_SECONDS
    # The actor stalls while the reward worker hangs: the relay's word must come first.
    spec["faultTolerance"]["hangTimeoutFloorSeconds"] = 180
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@dataclass
class Run:
    code: int
    result: dict[str, Any]
    output: str
    workdir: Path

    @property
    def snap(self) -> dict[str, Any]:
        return self.result["snapshot"]

    def records(self) -> list[Any]:
        records, _torn = read(self.workdir / "ledger" / "actor.jsonl")
        return records

    def incidents(self) -> list[dict[str, Any]]:
        return self.snap["incidents"]

    def roles(self) -> dict[str, dict[str, Any]]:
        return {r["role"]: r for r in self.snap["roles"]}

    def pid_generations(self, role: str) -> dict[int, list[int]]:
        return {int(g): pids for g, pids in self.result["role_pids"][role].items()}


def launch(tmp_path: Path, stalwart_cmd: list[str], job: Path, *faults: str) -> Run:
    code, result, output = run_job(tmp_path, stalwart_cmd, job, *faults, timeout=900)
    return Run(code, result, output, tmp_path / "run")


@pytest.fixture(scope="module")
def role_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("grpo-role")
    yield launch(tmp, STALWART, grpo_variant(tmp, steps=STEPS, scope="Role", interval=INTERVAL), *FAULTS)


@pytest.fixture(scope="module")
def job_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("grpo-job")
    job = grpo_variant(tmp, steps=JOB_STEPS, scope="Job", interval=2, rollouts=1)
    yield launch(tmp, STALWART, job, "kill-node:node=2,step=2")  # the rollout node


def incident(run: Run, failure_class: str, role: str) -> dict[str, Any]:
    found = [i for i in run.incidents() if i["failure_class"] == failure_class and i["role"] == role]
    assert len(found) == 1, run.incidents()
    return found[0]


def test_the_job_finishes_and_every_prompt_is_trained_on_exactly_once(role_run: Run) -> None:
    assert role_run.code == 0, role_run.output
    assert role_run.snap["phase"] == "Succeeded"
    records = role_run.records()
    assert problems(records) == []
    assert [r.step for r in history(records)] == list(range(1, STEPS + 1))


def test_a_dead_rollout_node_is_hot_swapped_in_its_role_alone(role_run: Run) -> None:
    lost = incident(role_run, "LostNode", "rollout")
    assert lost["scope"] == "Role" and lost["counted"] is False
    assert lost["evicted"] == ["node-3"] and lost["replacements"] == {"node-3": "node-6"}  # its standby
    assert "the rollout role only" in lost["action"]
    # The actor kept its processes: one incarnation until the actor's own failure, which came later.
    starts = [r for r in role_run.records() if isinstance(r, StartRecord)]
    assert len(starts) == 2 and starts[1].time > lost["restarted_at"]
    roles = role_run.roles()
    assert roles["rollout"]["generation"] == 2
    assert roles["reference"]["generation"] == 1 and len(role_run.pid_generations("reference")) == 1


def test_a_killed_actor_rank_restarts_the_actor_alone_from_its_checkpoint(role_run: Run) -> None:
    crash = incident(role_run, "WorkerCrash", "actor")
    assert crash["scope"] == "Role" and crash["rank"] == 2 and crash["exit_code"] == -9, crash["evidence"]
    records = role_run.records()
    first, second = [r for r in records if isinstance(r, StartRecord)]
    trained = [r.step for r in records if isinstance(r, StepRecord) and r.incarnation == first.incarnation]
    # Its newest checkpoint (the ledger may not have heard of its commit yet when the rank died).
    assert first.base_step == 0 and second.base_step % INTERVAL == 0 and 0 < second.base_step <= max(trained)
    assert crash["resumed_step"] == second.base_step + 1
    # Rollouts and reference kept their processes through it: their pids changed only with their
    # own failures (one rollout restart; the reference never).
    assert len(role_run.pid_generations("rollout")) == 2
    assert role_run.roles()["actor"]["generation"] == 2


def test_a_hung_reward_worker_is_localized_to_its_node_and_only_its_role_restarts(role_run: Run) -> None:
    hang = incident(role_run, "Hang", "reward")
    assert hang["scope"] == "Role" and hang["suspects"] == ["node-4"] and hang["evicted"] == ["node-4"]
    assert any("held prompt groups" in line for line in hang["evidence"])
    roles = role_run.roles()
    assert roles["reward"]["generation"] == 2
    # Nothing else restarted with it: the actor's second incarnation ran to the end.
    assert roles["actor"]["generation"] == 2 and roles["rollout"]["generation"] == 2
    second = [r for r in role_run.records() if isinstance(r, StartRecord)][-1]
    assert {r.incarnation for r in history(role_run.records())[second.base_step :]} == {second.incarnation}


def test_a_dead_relay_node_is_replaced_and_every_role_finds_the_new_relay(role_run: Run) -> None:
    """The relay starts empty on its new node; the actor's ranks tell it where the actor is (whichever
    reaches it first), and no other role's processes change."""
    lost = incident(role_run, "LostNode", "relay")
    assert lost["scope"] == "Role" and lost["counted"] is False and lost["evicted"] == ["node-0"]
    assert "the relay role only" in lost["action"]
    roles = role_run.roles()
    assert roles["relay"]["generation"] == 2 and len(role_run.pid_generations("relay")) == 2
    # The actor trained on through it with the same processes: its second incarnation finished.
    assert len(role_run.pid_generations("actor")) == 2
    finish = [r for r in role_run.records() if isinstance(r, FinishRecord)]
    assert len(finish) == 1 and finish[0].step == STEPS
    assert incident(role_run, "WorkerCrash", "actor")["restarted_at"] < lost["detected_at"]


def test_machine_faults_count_against_no_budget_and_each_role_keeps_its_own_books(role_run: Run) -> None:
    snap = role_run.snap
    assert snap["restarts"] == 1  # the actor's crash alone (a worker crash counts; lost nodes and hangs do not)
    assert snap["infra_restarts"] == 3
    by_role = {m["role"]: m for m in snap["mttr_by_role"]}
    assert set(by_role) == {"rollout", "actor", "reward", "relay"}
    assert all(m["recovered"] == 1 and m["mttr_seconds"] > 0 for m in by_role.values())
    assert snap["ettr"]["ettr"] is not None
    assert len(role_run.incidents()) == 4, role_run.incidents()  # no fault spilled into another


def test_the_policy_learns_under_the_runtime(role_run: Run) -> None:
    rewards = [r.reward for r in history(role_run.records())]
    untrained, trained = mean(rewards[:WINDOW]), mean(rewards[-WINDOW:])
    assert trained > untrained + MARGIN, f"reward {untrained:.3f} -> {trained:.3f}: {rewards}"


def test_restart_scope_job_restarts_every_role_for_a_rollout_node(job_run: Run) -> None:
    assert job_run.code == 0, job_run.output
    lost = incident(job_run, "LostNode", "rollout")
    assert lost["scope"] == "Job" and "every role" in lost["action"]
    roles = job_run.roles()
    assert {r["generation"] for r in roles.values()} == {2}
    for role in roles:
        gens = job_run.pid_generations(role)
        assert len(gens) == 2 and not set(gens[1]) & set(gens[2]), f"{role} kept a process: {gens}"
    records = job_run.records()
    assert problems(records) == []
    starts = [r for r in records if isinstance(r, StartRecord)]
    assert len(starts) == 2, "the actor restarted with everything else"
