"""End to end: the Megatron-core example under `stalwart run` (2 nodes x 2 gloo workers, TP=1, PP=1),
with a killed worker, trains exactly the samples a clean run trains.

The claim is the Megatron adapter's in a real job: the model's and the optimizer's sharded state
dicts and the loader's position, saved together through the engine, resume a restarted job at the
checkpoint with nothing skipped or repeated (the sample logs, keeping each step's newest
generation, equal the clean run's step for step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support import stalwart_run
from support.paths import REPO

from stalwart.agents.worker_sdk import trained_samples

pytestmark = pytest.mark.e2e
pytest.importorskip("megatron.core")

JOB = REPO / "examples" / "megatron-gpt.yaml"
STEPS = 30


def run(tmp_path: Path, samples: Path, *inject: str) -> tuple[int, dict[str, Any], str]:
    tmp_path.mkdir()
    return stalwart_run.run_audited(JOB, tmp_path, samples, *inject, timeout=600)  # Megatron's imports are slow


def test_a_killed_worker_resumes_with_exactly_the_clean_runs_samples(tmp_path: Path) -> None:
    code, result, output = run(tmp_path / "clean", tmp_path / "clean-samples")
    snap = result["snapshot"]
    assert code == 0 and snap["step"] == STEPS and snap["incidents"] == [], output
    clean = trained_samples(tmp_path / "clean-samples")
    assert sorted(clean) == list(range(1, STEPS + 1)), clean.keys()

    code, result, output = run(tmp_path / "faulty", tmp_path / "faulty-samples", "kill-worker:rank=1,step=15")
    snap = result["snapshot"]
    assert code == 0 and result["phase"] == "Succeeded", output
    assert snap["step"] == STEPS and snap["restarts"] == 1, snap
    [incident] = snap["incidents"]
    assert incident["failure_class"] == "WorkerCrash" and incident["rank"] == 1, incident
    # At the newest checkpoint before the kill (every 10 steps: step 10, or later when a loaded
    # machine let the rank run past it before the signal landed).
    resumed = incident["resumed_step"]
    assert resumed > 1 and (resumed - 1) % 10 == 0 and resumed <= incident["step_at_failure"] + 1, incident
    assert trained_samples(tmp_path / "faulty-samples") == clean
