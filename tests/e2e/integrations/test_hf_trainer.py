"""End to end: the Hugging Face Trainer example under `stalwart run` (2 nodes x 2 gloo workers), with
a worker killed and with a node lost. Each recovers from a checkpoint and trains exactly the samples
a clean run trains: the integration's loader position rides in the checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from support import stalwart_run
from support.paths import REPO

from stalwart.agents.worker_sdk import trained_samples

JOB = REPO / "examples" / "hf-trainer.yaml"
STEPS = 30  # the example job's --steps; a checkpoint every 10
QUICK = {"preflight": False, "stopGraceSeconds": 3, "slowdownFactor": 10}  # as the e2e job: a shared, busy machine
CMD = [sys.executable, "-m", "stalwart.cli.main"]


def run(tmp_path: Path, *inject: str, standbys: int = 0) -> tuple[int, dict[str, Any], str, Path]:
    samples = tmp_path / "samples"
    job = stalwart_run.job_variant(
        JOB, tmp_path, args=["--sample-log", str(samples)], fault_tolerance=QUICK, standbys=standbys
    )
    code, result, output = stalwart_run.run_job(tmp_path, CMD, job, *inject, timeout=300)
    return code, result, output, samples


@pytest.fixture(scope="module")
def clean_samples(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[int]]:
    """What a clean run trains, step by step (run once for the module)."""
    code, result, output, samples = run(tmp_path_factory.mktemp("hf-clean"))
    assert code == 0, output
    assert result["snapshot"]["step"] == STEPS and result["snapshot"]["incidents"] == []
    trained = trained_samples(samples)
    assert sorted(trained) == list(range(1, STEPS + 1))
    return trained


def assert_recovered(incident: dict[str, Any]) -> None:
    assert incident["resumed_step"] > 1 and (incident["resumed_step"] - 1) % 10 == 0, incident  # a checkpoint
    assert incident["resumed_step"] <= incident["step_at_failure"] + 1, incident
    assert incident["first_step_at"] is not None and incident["first_step_at"] >= incident["failed_at"]


def test_a_killed_worker_resumes_model_and_data_exactly(tmp_path: Path, clean_samples: dict[int, list[int]]) -> None:
    code, result, output, samples = run(tmp_path, "kill-worker:rank=1,step=15")
    snap = result["snapshot"]
    assert code == 0, output
    assert result["phase"] == "Succeeded" and snap["step"] == STEPS
    [crash] = snap["incidents"]
    assert crash["failure_class"] == "WorkerCrash" and crash["rank"] == 1, crash
    assert_recovered(crash)
    assert trained_samples(samples) == clean_samples  # nothing skipped, nothing repeated


def test_a_lost_node_is_replaced_and_the_data_continues_exactly(
    tmp_path: Path, clean_samples: dict[int, list[int]]
) -> None:
    code, result, output, samples = run(tmp_path, "kill-node:node=1,step=15", standbys=1)
    snap = result["snapshot"]
    assert code == 0, output
    assert result["phase"] == "Succeeded" and snap["step"] == STEPS
    [lost] = snap["incidents"]
    assert lost["failure_class"] == "LostNode" and lost["evicted"] == ["node-1"], lost
    assert_recovered(lost)
    assert trained_samples(samples) == clean_samples
