"""A cluster that runs out of machines: `stalwart run --max-nodes` caps the machines, a killed node
takes its machine with it, and a restart that never gets its replacement fails the job, saying why."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from support import stalwart_run
from support.paths import REPO

JOB = REPO / "tests" / "data" / "jobs" / "e2e.yaml"


def test_a_lost_node_with_no_standby_and_no_free_machine_fails_the_job_naming_the_capacity(
    tmp_path: Path, stalwart_cmd: list[str]
) -> None:
    job = stalwart_run.job_variant(JOB, tmp_path, fault_tolerance={"restartTimeoutSeconds": 5}, standbys=0)
    code, result, output = stalwart_run.run_job(
        tmp_path, stalwart_cmd, job, "kill-node:node=1,step=15", options=["--max-nodes", "2"]
    )
    snap = result["snapshot"]
    assert code == 1 and result["phase"] == "Failed", output
    assert snap["reason"] == "CapacityUnavailable", snap["message"]
    message = snap["message"]
    assert "\n" not in message and "runbook show capacity_unavailable" in message, message
    assert message.startswith("the restart waited 5 s for 1 of 2 nodes to register"), message  # the configured time
    [incident] = snap["incidents"]  # the lost node was handled (evicted) before the wait began
    assert incident["failure_class"] == "LostNode", incident
    missing = re.search(r"to register \(([^)]*)\)", message)
    assert missing is not None, message
    for node in missing.group(1).split(", "):  # the replacement the cluster never started
        assert not (tmp_path / "run" / "nodes" / node / "agent.pid").exists(), node
    assert "no machine free for a node" in (tmp_path / "run" / "controller.log").read_text()


def test_a_machine_limit_below_the_jobs_size_is_refused_before_anything_starts(
    tmp_path: Path, stalwart_cmd: list[str]
) -> None:
    job = stalwart_run.job_variant(JOB, tmp_path)
    proc = subprocess.run(
        [*stalwart_cmd, "run", str(job), "--workdir", str(tmp_path / "run"), "--max-nodes", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "--max-nodes 1 is fewer than the 2 nodes" in proc.stdout + proc.stderr
    assert not (tmp_path / "run").exists()
