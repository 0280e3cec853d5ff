"""End to end: examples/dcp_tiny.py (plain dcp.async_save / dcp.load through DCPWriter / DCPReader)
under `stalwart run`, 2 nodes x 2 gloo workers, through a lost node: the standby resumes from the
memory tier's peer copy and the run trains exactly the samples a clean run trains."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from support import stalwart_run
from support.paths import REPO

from stalwart.agents.worker_sdk import trained_samples

pytestmark = pytest.mark.e2e

JOB = REPO / "examples" / "dcp-tiny.yaml"
STEPS = 30
INTERVAL = 10


def run(tmp_path: Path, samples: Path, *inject: str, standbys: int = 0) -> tuple[int, dict[str, Any], str]:
    return stalwart_run.run_audited(JOB, tmp_path, samples, *inject, standbys=standbys)


def resumes(run_dir: Path) -> list[tuple[int, str]]:
    """(step, tier) of every resume rank 0 printed, from the workers' logs."""
    found = []
    for log in sorted(run_dir.rglob("*.log")):
        for m in re.finditer(r"resuming_from_step=(\d+) tier=(\S+)", log.read_text(errors="replace")):
            found.append((int(m.group(1)), m.group(2)))
    return found


def test_a_lost_node_resumes_from_the_memory_tiers_peer_copy_with_the_clean_runs_samples(
    tmp_path: Path, example_shards: None
) -> None:
    clean = tmp_path / "clean"
    clean.mkdir()
    code, result, output = run(clean, clean / "samples")
    assert code == 0 and result["snapshot"]["step"] == STEPS and result["snapshot"]["incidents"] == [], output
    want = trained_samples(clean / "samples")
    assert sorted(want) == list(range(1, STEPS + 1))

    faulty = tmp_path / "faulty"
    faulty.mkdir()
    code, result, output = run(faulty, faulty / "samples", "kill-node:node=1,step=15", standbys=1)
    snap = result["snapshot"]
    assert code == 0 and result["phase"] == "Succeeded", output
    assert snap["step"] == STEPS, snap
    [incident] = snap["incidents"]
    assert incident["failure_class"] == "LostNode" and incident["evicted"] == ["node-1"], incident
    # The newest checkpoint before the kill (step 10, or later when a loaded machine let the ranks
    # run past the next one before the node was killed).
    resumed = incident["resumed_step"]
    assert resumed > 1 and (resumed - 1) % INTERVAL == 0 and resumed <= incident["step_at_failure"] + 1, incident
    # The new generation read it from host memory: the lost node's shards from its peer's copy.
    assert (resumed - 1, "memory") in resumes(faulty / "run"), resumes(faulty / "run")
    assert trained_samples(faulty / "samples") == want
