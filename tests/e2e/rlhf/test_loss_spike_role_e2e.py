"""Loss spikes are judged on the role that reports a loss, not on rank 0. As in the GRPO example,
whose rank 0 is the relay, the job's first role here reports no loss: a `monitor` worker (rank 0)
that marks its work and never a step, before a `trainer` role of 2 ranks (job-wide ranks 1-2, the
tiny pretraining example). `--inject loss-spike:rank=1` makes the trainer's first rank report a loss
100x what it computed, once: the controller sees the spike in the trainer's series, rolls the job
back after the stop-time checks, and the job finishes. The trainer steps several times per
heartbeat, so the spike is usually not the newest loss of any beat: the beat's peak loss carries it.

(The GRPO example's own actor reports no loss at all: a policy-gradient loss hovers around zero and
changes sign, so there is no loss series to watch in that job; see examples/rlhf/actor.py.)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml
from support.paths import REPO
from support.stalwart_run import job_variant, run_job

JOB = REPO / "tests" / "data" / "jobs" / "e2e.yaml"
STEPS = 50
SPIKE_AT = 30  # after a few heartbeats of losses, the spike's baseline
STALWART = [sys.executable, "-m", "stalwart.cli.main"]
# Rank 0's role: it marks a unit of work every half second for a minute and exits 0 (a worker that
# does not step, as an RLHF relay, rollout or reward worker), reporting no loss.
MONITOR = (
    "import time\n"
    "from stalwart.agents.worker_sdk import report_work\n"
    "for unit in range(120):\n"
    "    report_work(unit)\n"
    "    time.sleep(0.5)\n"
)
pytestmark = pytest.mark.timeout(900)


def two_role_job(tmp_path: Path) -> Path:
    # About five steps per heartbeat (0.5 s).
    path = job_variant(JOB, tmp_path, args=["--steps", str(STEPS), "--step-delay", "0.1"])
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["name"] = "e2e-loss-spike-role"  # its own shared-memory names beside other runs
    spec = doc["spec"]
    [trainer] = spec["roles"]
    trainer.update(replicas=1, restartScope="Role")
    monitor = {
        "name": "monitor",
        "command": ["python", "-c", MONITOR],
        "workingDir": trainer["workingDir"],
        "restartScope": "Role",
    }
    spec["roles"] = [monitor, trainer]
    spec["checkpoint"]["intervalSteps"] = 5  # the rollback has a checkpoint before the spike
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_loss_spike_on_the_first_rank_that_reports_a_loss_rolls_the_job_back(tmp_path: Path) -> None:
    code, result, output = run_job(
        tmp_path, STALWART, two_role_job(tmp_path), f"loss-spike:rank=1,step={SPIKE_AT}", timeout=600
    )
    snap = result["snapshot"]
    assert code == 0 and result["phase"] == "Succeeded", output
    assert [f["fault"] for f in result["faults"]] == [f"loss-spike rank=1 at step {SPIKE_AT}"], result["faults"]
    [spike] = [i for i in snap["incidents"] if i["failure_class"] == "LossSpike"]
    assert spike["policy_action"] == "Rollback", spike
    # The trainer's series: its first rank's loss, 100x what it computed at a step after the fault's.
    seen = re.match(r"loss ([\d.e+]+) at step (\d+), recent mean ([\d.e+]+)$", spike["evidence"][0])
    assert seen is not None, spike["evidence"]
    loss, step, mean = float(seen[1]), int(seen[2]), float(seen[3])
    assert step >= SPIKE_AT and loss > 20 * mean, spike["evidence"]
    assert snap["step"] == STEPS, snap
