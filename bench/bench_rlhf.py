"""RLHF recovery benchmark: one rollout node dies, `restartScope: Role` against `Job`, in the same run.

    nice .venv/bin/python bench/bench_rlhf.py            # two runs of the GRPO example, then the ETTR run
    nice .venv/bin/python bench/bench_rlhf.py --no-ettr  # the two arms only

Each arm is a real `stalwart run` of examples/rlhf/grpo.yaml (relay, actor of 2 gloo ranks, 2
rollouts, reward, reference, one rollout standby; real etcd, agents, controller) with the second
rollout node SIGKILLed once the job reached step K. Figures come from the actor's ledger (one line
per step, with its time) and from the incidents the controller recorded:

- actor idle time: the longest gap between two of the actor's steps (every generation's, in time
  order) from the failure to its first step after the recovery, less one mean step time (what a step
  would have cost anyway);
- work lost: that idle time plus the steps trained again (ledger steps - history) x the mean step time;
- recovery: the incident's failure -> first step after it, as the controller measured it.

The anchor is the same job with every role `restartScope: Job` (every role restarts; the actor
reloads its checkpoint and redoes the steps since it), configured as a user would: the same standby,
the same checkpoint interval, warm workers on. The ETTR run injects one failure into each role (the
relay's and the reference's nodes die, an actor rank is killed, a rollout node dies, the reward
worker hangs) and reports the job's ETTR and each role's MTTR from the incidents.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from stalwart.rlhf.ledger import StepRecord, history, read
from stalwart.spec import ALLOWED_PATHS_ENV

REPO = Path(__file__).resolve().parents[1]
GRPO = REPO / "examples" / "rlhf" / "grpo.yaml"
STEPS = 30
ETTR_STEPS = 80  # five recoveries one after another: the job must outlast the last fault's turn
FAIL_AT = 12
INTERVAL = 5
# Each after the job recovered from the one before: steps outrun detection, so faults placed by step
# alone would land in one another's recoveries.
EACH_ROLE = (
    "kill-node:node=3,step=6",  # a rollout node
    "kill-worker:rank=2,step=12,after=recovery",  # actor rank 1
    "hang-worker:rank=5,step=18,after=recovery",  # the reward worker
    "kill-node:node=5,step=22,after=recovery",  # the reference's node
    "kill-node:node=0,step=26,after=recovery",  # the relay's node
)


def variant(folder: Path, scope: str, lease_seconds: float = 60, steps: int = STEPS) -> Path:
    doc = yaml.safe_load(GRPO.read_text())
    for role in doc["spec"]["roles"]:
        role["workingDir"] = str(GRPO.parent)
        role["restartScope"] = scope
        if role["name"] == "actor":
            role["command"] = ["python", "actor.py", "--steps", str(steps), "--checkpoint-interval", str(INTERVAL)]
    doc["spec"]["dataPlane"]["leaseSeconds"] = lease_seconds
    doc["spec"]["faultTolerance"]["hangTimeoutFloorSeconds"] = 180
    path = folder / f"grpo-{scope.lower()}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(folder: Path, job: Path, *faults: str) -> tuple[dict[str, Any], list[StepRecord], list[Any]]:
    summary = folder / "summary.json"
    argv = [sys.executable, "-m", "stalwart.cli.main", "run", str(job), "--workdir", str(folder / "run")]
    argv += ["--summary-json", str(summary), "--timeout", "1200"]
    for fault in faults:
        argv += ["--inject", fault]
    env = {**os.environ, ALLOWED_PATHS_ENV: str(REPO / "examples")}
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1500)
    if proc.returncode != 0:
        raise SystemExit(
            f"{job.name}: stalwart run exited {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    print(f"  {job.name}: {time.monotonic() - started:.0f}s", file=sys.stderr)
    records, _ = read(folder / "run" / "ledger" / "actor.jsonl")
    return json.loads(summary.read_text()), history(records), records


def arm(folder: Path, scope: str) -> dict[str, Any]:
    result, steps, records = run(folder, variant(folder, scope), f"kill-node:node=3,step={FAIL_AT}")
    fired = result["faults"][0]["fired_at"]
    times = [r.time for r in steps]
    usual = statistics.median(b - a for a, b in zip(times, times[1:], strict=False))
    (incident,) = result["snapshot"]["incidents"]
    recovered = incident["first_step_at"] or fired
    # Every step the actor took, in time order, generations included: a restarted actor's steps
    # replace the old generation's in the history, so the history alone hides the stall (the old
    # actor may step on briefly after the fault, and those steps are redone after the restart).
    taken = sorted(r.time for r in records if isinstance(r, StepRecord))
    stalls = [b - a for a, b in zip(taken, taken[1:], strict=False) if b > fired and a <= recovered + usual]
    idle = max(0.0, max(stalls, default=0.0) - usual)
    redone = sum(1 for r in records if isinstance(r, StepRecord)) - len(steps)
    recovery = recovered - incident["failed_at"]
    return {
        "scope": scope,
        "actor_idle_s": round(idle, 2),
        "steps_redone": redone,
        "work_lost_s": round(idle + redone * usual, 2),
        "mean_step_s": round(usual, 3),
        "recovery_s": round(recovery, 2),
        "incident_scope": incident["scope"],
    }


def ettr_run(folder: Path) -> dict[str, Any]:
    result, _, _ = run(folder, variant(folder, "Role", lease_seconds=20, steps=ETTR_STEPS), *EACH_ROLE)
    snap = result["snapshot"]
    return {"ettr": snap["ettr"], "mttr_by_role": snap["mttr_by_role"], "incidents": len(snap["incidents"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-ettr", action="store_true", help="skip the run with one failure per role")
    args = parser.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-rlhf-") as tmp:
        root = Path(tmp)
        arms = {}
        for scope in ("Role", "Job"):
            (root / scope).mkdir()
            arms[scope] = arm(root / scope, scope)
        ettr = None
        if not args.no_ettr:
            (root / "ettr").mkdir()
            ettr = ettr_run(root / "ettr")
    role, job = arms["Role"], arms["Job"]
    ratio = job["actor_idle_s"] / max(role["actor_idle_s"], job["mean_step_s"] / 10)
    report = {"load_before": load, "load_after": os.getloadavg(), "arms": arms, "idle_ratio_job_over_role": ratio}
    report["ettr_run"] = ettr
    print(json.dumps(report, indent=2))
    print("\n| scope | actor idle (s) | steps redone | work lost (s) | recovery (s) |")
    print("|---|---|---|---|---|")
    for a in (role, job):
        print(f"| {a['scope']} | {a['actor_idle_s']} | {a['steps_redone']} | {a['work_lost_s']} | {a['recovery_s']} |")
    print(f"\nJob / Role actor idle time: {ratio:.1f}x (target: >= 5x)")


if __name__ == "__main__":
    main()
