"""A hang with no suspect under `stalwart run`: every rank of the first generation stops at one step
(`--inject hang-job:step=N`), so every stack looks alike and diagnosis names no one. The controller
looks twice, then restarts after the stop-time checks, which pass on both nodes: the incident records
them, and the failure counts as the first of the two unexplained ones that start a dual-phase replay.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from support.paths import REPO
from support.stalwart_run import job_variant, run_job

JOB = REPO / "tests" / "data" / "jobs" / "e2e.yaml"
STEPS = 24  # checkpoints every 10: the hang at step 12 resumes from 10
STALWART = [sys.executable, "-m", "stalwart.cli.main"]
pytestmark = pytest.mark.timeout(900)


def test_a_hang_with_no_suspect_runs_the_stop_time_checks_and_counts_towards_a_replay(tmp_path: Path) -> None:
    job = job_variant(
        JOB,
        tmp_path,
        args=["--steps", str(STEPS)],
        # A floor well above a loaded machine's slowest step and checkpoint: only the injected hang stalls.
        fault_tolerance={"hangTimeoutFloorSeconds": 20},
        failure_policy={"replayAfter": 2},
    )
    doc = yaml.safe_load(job.read_text())
    doc["metadata"]["name"] = "e2e-hang-job"  # its own shared-memory names beside other runs
    job.write_text(yaml.safe_dump(doc))
    code, result, output = run_job(tmp_path, STALWART, job, "hang-job:step=12", timeout=600)
    snap = result["snapshot"]
    assert code == 0 and result["phase"] == "Succeeded" and snap["step"] == STEPS, output
    [hang] = snap["incidents"]
    assert hang["failure_class"] == "Hang" and hang["suspects"] == [] and hang["evicted"] == [], hang
    assert "run stop-time checks" in hang["action"], hang["action"]
    recorded = (
        "stop-time checks passed on node-0, node-1: unexplained failure 1 of the 2 that start a dual-phase replay"
    )
    assert recorded in hang["evidence"], hang["evidence"]
    assert snap["slots"] == ["node-0", "node-1"] and snap["evicted"] == [], snap  # nothing to blame, no one evicted
