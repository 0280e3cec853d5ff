"""End to end: an etcd outage costs the job nothing (issue 16). `stalwart run` with a real etcd, a
controller and 2 agents x 2 gloo workers; etcd is first SIGSTOPped for 10 s, then, once the job is
past step 50, SIGKILLed and started again (same port, same data) 3 s later, both through `--inject`
as a user would. One run serves the module.

Each step sleeps 0.25 s, so the 70 steps left after the pause fires take at least 17 s: the pause
ends mid-run, whatever the machine's load. The pause outlasts the 5 s lease TTL, so etcd expires
every lease when it resumes (the agents must register again); the restart breaks every watch (the
agents must get the controller's commands, the last one is the shutdown, over resumed watches).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO
from support.stalwart_run import agent_log, job_variant, run_job

JOB = REPO / "tests" / "data" / "jobs" / "e2e.yaml"
STALWART = [sys.executable, "-m", "stalwart.cli.main"]  # the module's run outlives a test's fixtures
STEPS = 80
FAULTS = ("pause-etcd:step=10,seconds=10", "kill-etcd:step=50,seconds=3")
NODES = ("node-0", "node-1")
REGISTERED_AGAIN = "node lease lapsed while heartbeats could not reach etcd; registered again under a new lease"

Run = tuple[int, dict[str, Any], str, Path]
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def outage_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp("etcd-outage")
    job = job_variant(JOB, tmp, args=["--steps", str(STEPS), "--step-delay", "0.25"])
    code, result, output = run_job(tmp, STALWART, job, *FAULTS, timeout=480)
    return code, result, output, tmp / "run"


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def test_the_job_finishes_through_both_outages_with_no_restart_and_a_clean_summary(outage_run: Run) -> None:
    code, result, output, _ = outage_run
    snap = result["snapshot"]
    assert code == 0, output
    assert result["phase"] == "Succeeded" and snap["reason"] == "Completed"
    assert [f["fault"] for f in result["faults"]] == ["pause-etcd +10s at step 10", "kill-etcd +3s at step 50"]
    assert snap["step"] == STEPS and snap["generation"] == 1
    assert snap["restarts"] == 0 and snap["infra_restarts"] == 0 and snap["incidents"] == []
    assert snap["ettr"]["ettr"] == pytest.approx(1.0)
    assert set(result["agents_by_generation"]) == {"1"}  # one generation, its agents never replaced
    assert "Succeeded" in output and "Traceback" not in output


def test_the_runner_says_each_outage_in_one_line_and_restarts_the_etcd_it_started(outage_run: Run) -> None:
    _, result, output, _ = outage_run
    [paused, killed] = result["faults"]
    assert f"[fault] pause-etcd +10s at step 10: paused {paused['target']}" in output
    assert paused["target"].endswith("for 10s") and killed["target"].endswith("down for 3s")
    assert output.count("etcd unreachable (") == 2 and output.count("etcd is back after") == 2
    assert output.count("etcd exited (code -9); starting it again on") == 1
    assert result["controller_starts"] == 1  # the controller rode both out: never started again


def test_agents_keep_their_workers_and_register_again_when_their_leases_lapsed(outage_run: Run) -> None:
    _, _, _, run_dir = outage_run
    for node in NODES:
        lines = agent_log(run_dir, node)
        msgs = [line["msg"] for line in lines]
        assert msgs.count("workers started") == 1 and msgs.count("stopping workers") == 0, node
        assert msgs.count("etcd unreachable; the workers keep training") == 2, node
        assert msgs.count("etcd is back") == 2, node
        # The pause outlasted the lease: the node registered again under a new lease, once.
        assert msgs.count(REGISTERED_AGAIN) == 1, node
        # The last command (the job's end) came over a watch that etcd's restart had broken.
        [exiting] = [line for line in lines if line["msg"] == "agent exiting"]
        assert exiting["reason"] == "job finished (generation 1)" and exiting["code"] == 0, node
        assert any(line["msg"] == "watch resumed" for line in lines), node


def test_the_controller_counts_no_node_lost_and_takes_its_leadership_back(outage_run: Run) -> None:
    _, _, _, run_dir = outage_run
    msgs = [line["msg"] for line in log_lines(run_dir / "controller.log")]
    assert msgs.count("etcd unreachable; retrying") == 2 and msgs.count("etcd is back") == 2
    assert msgs.count("leadership lapsed while etcd was away; leading again") == 1
    assert "job finished" in msgs
    assert not {"starting node", "stopping node"} & set(msgs[msgs.index("etcd unreachable; retrying") :])
