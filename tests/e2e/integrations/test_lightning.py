"""End to end: the Lightning example under `stalwart run` (2 nodes x 2 gloo workers), with a killed
worker and with a lost node, trains exactly the samples a clean run trains.

The integration's claim is exactly-once data across recoveries: the faulty runs' sample logs,
keeping each step's newest generation, equal the clean run's step for step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import stalwart_run
from support.paths import REPO

from stalwart.agents.worker_sdk import trained_samples

pytestmark = pytest.mark.e2e

JOB = REPO / "examples" / "lightning-tiny.yaml"
STEPS = 30
INTERVAL = 10


def run(tmp_path: Path, samples: Path, *inject: str, standbys: int = 0) -> tuple[int, dict[str, Any], str]:
    return stalwart_run.run_audited(JOB, tmp_path, samples, *inject, standbys=standbys)


@pytest.fixture(scope="module")
def clean_samples(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[int]]:
    """The clean run's samples, step by step (one run for the module)."""
    tmp_path = tmp_path_factory.mktemp("lightning-clean")
    code, result, output = run(tmp_path, tmp_path / "samples")
    snap = result["snapshot"]
    assert code == 0 and snap["step"] == STEPS and snap["incidents"] == [], output
    samples = trained_samples(tmp_path / "samples")
    assert sorted(samples) == list(range(1, STEPS + 1)), samples.keys()
    return samples


def assert_resumed_at_checkpoint(incident: dict[str, Any]) -> None:
    assert incident["resumed_step"] > 1 and (incident["resumed_step"] - 1) % INTERVAL == 0, incident
    assert incident["resumed_step"] <= incident["step_at_failure"] + 1, incident
    assert incident["first_step_at"] is not None and incident["first_step_at"] >= incident["failed_at"], incident


def test_a_killed_worker_resumes_with_exactly_the_clean_runs_samples(
    tmp_path: Path, clean_samples: dict[int, list[int]]
) -> None:
    code, result, output = run(tmp_path, tmp_path / "samples", "kill-worker:rank=1,step=15")
    snap = result["snapshot"]
    assert code == 0 and result["phase"] == "Succeeded", output
    assert snap["step"] == STEPS and snap["restarts"] == 1, snap
    [incident] = snap["incidents"]
    assert incident["failure_class"] == "WorkerCrash" and incident["rank"] == 1, incident
    # At the newest checkpoint before the kill (step 10, or 20 when a loaded machine let the rank run
    # past it before the signal landed).
    assert_resumed_at_checkpoint(incident)
    assert trained_samples(tmp_path / "samples") == clean_samples


def test_a_lost_node_is_replaced_by_the_standby_with_exactly_the_clean_runs_samples(
    tmp_path: Path, clean_samples: dict[int, list[int]]
) -> None:
    code, result, output = run(tmp_path, tmp_path / "samples", "kill-node:node=1,step=15", standbys=1)
    snap = result["snapshot"]
    assert code == 0 and result["phase"] == "Succeeded", output
    assert snap["step"] == STEPS, snap
    [incident] = snap["incidents"]
    assert incident["failure_class"] == "LostNode" and incident["evicted"] == ["node-1"], incident
    assert incident["replacements"] == {"node-1": "node-2"}, incident
    assert_resumed_at_checkpoint(incident)
    assert trained_samples(tmp_path / "samples") == clean_samples
