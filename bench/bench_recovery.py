"""Recovery benchmark: hot-swap against requeue, in the same run, on this machine.

    .venv/bin/python bench/bench_recovery.py              # about 10 minutes on 2 cores
    .venv/bin/python bench/bench_recovery.py --repeats 1  # a quicker single pass
    .venv/bin/python bench/bench_recovery.py --only lost-node --keep /tmp/runs  # the pairs, logs kept
    .venv/bin/python bench/bench_recovery.py --only hot-swap --repeats 1 --output /tmp/h.json  # phases

Each scenario is a real `stalwart run` of the example job (2 nodes x 2 gloo workers, real etcd,
agents, controller and diagnosis service) with one injected fault, and every figure comes from the
incident the controller recorded: failure -> detected -> restarted -> first completed step after.

- Lost node, hot-swap: the node is SIGKILLed (agent and workers); the warm standby takes its ranks,
  the healthy node keeps its agent and restarts its workers from warm processes (torch imported).
- Lost node, requeue (the anchor): the same fault with `failurePolicy.recovery: Requeue`, no standby
  and no warm workers: every node is relaunched from scratch and loads the checkpoint from storage,
  as a resubmitted job would.
- Detection latency per class: a node that goes silent (SIGSTOP: no socket closes, only its lease
  tells), a worker crash, a hang (adaptive timeout, then stacks and diagnosis), NaN loss and a rank
  that turns slow (the pace, then rounds of stacks).

Writes docs/recovery-measured.json (read by the ETTR simulator) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from stalwart.spec import ALLOWED_PATHS_ENV

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "pretrain-tiny.yaml"
OUT = REPO / "docs" / "recovery-measured.json"


def job_file(folder: Path, *, requeue: bool = False, args: list[str] = (), ft: dict[str, Any] | None = None) -> Path:  # type: ignore[assignment]
    doc = yaml.safe_load(EXAMPLE.read_text())
    role = doc["spec"]["roles"][0]
    role["command"] = list(role["command"])
    role["command"][role["command"].index("--steps") + 1] = "100"
    role["command"] += list(args)
    role["workingDir"] = str(EXAMPLE.parent)
    for source in doc["spec"]["data"]["sources"]:
        source["shards"] = [str(EXAMPLE.parent / s) for s in source["shards"]]
    doc["spec"]["faultTolerance"].update(
        {"preflight": False, "heartbeatIntervalSeconds": 0.5, "leaseTtlSeconds": 5, "stopGraceSeconds": 2, **(ft or {})}
    )
    if requeue:
        doc["spec"]["failurePolicy"]["recovery"] = "Requeue"
        doc["spec"]["standbys"] = {"count": 0, "minimum": 0}
        doc["spec"]["faultTolerance"]["warmWorkers"] = False
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(name: str, job: Path, folder: Path, *inject: str) -> dict[str, Any]:
    summary = folder / "summary.json"
    argv = [
        sys.executable,
        "-m",
        "stalwart.cli.main",
        "run",
        str(job),
        "--workdir",
        str(folder / "run"),
        "--summary-json",
        str(summary),
        "--timeout",
        "400",
    ]
    for fault in inject:
        argv += ["--inject", fault]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=500)
    if not summary.exists():
        raise SystemExit(f"{name}: no summary\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads(summary.read_text())
    snap = result["snapshot"]
    if result["phase"] != "Succeeded" or not snap["incidents"]:
        # Reported, not fatal: the other scenarios' figures still stand.
        print(f"  {name:<22} NOT MEASURED: phase {result['phase']}, incidents {len(snap['incidents'])}", flush=True)
        return {"scenario": name, "failed": f"phase {result['phase']}, incidents {len(snap['incidents'])}"}
    # The failure's time: when the injector struck (it notes the time before it signals), else the
    # controller's estimate (for a lost node, its last heartbeat: up to an interval early). The
    # incident is the first one detected after it (a node starved of CPU at start-up would be another).
    failed = result["faults"][0]["fired_at"] if result.get("faults") else snap["incidents"][0]["failed_at"]
    inc = next((i for i in snap["incidents"] if i["detected_at"] >= failed), snap["incidents"][0])
    if inc.get("first_step_at") is None:
        print(
            f"  {name:<22} NOT MEASURED: incident {inc['id']} ({inc['failure_class']}) has no first step after it",
            flush=True,
        )
        return {"scenario": name, "failed": f"incident {inc['id']} has no first step after it"}
    out = {
        "scenario": name,
        "class": inc["failure_class"],
        "action": inc["action"],
        "incidents": len(snap["incidents"]),
        "detect": inc["detected_at"] - failed,
        "restart": (inc["restarted_at"] or inc["detected_at"]) - failed,
        "first_step": inc["first_step_at"] - failed,
        "after_detect": inc["first_step_at"] - inc["detected_at"],
        "diagnose": (inc["diagnosed_at"] - inc["detected_at"]) if inc.get("diagnosed_at") else None,
        "wall": time.monotonic() - t0,
        "warm_starts": _warm_starts(folder / "run"),
        "phases": breakdown(folder / "run", inc, failed),
    }
    print(
        f"  {name:<22} {out['class']:<10} detect {out['detect']:6.2f}s  restart {out['restart']:6.2f}s  "
        f"first step {out['first_step']:6.2f}s  (run {out['wall']:.0f}s)",
        flush=True,
    )
    if name.startswith("lost-node/"):
        print("  " + " " * 22 + " " + _phases_line(out["phases"]), flush=True)
    return out


# The example's start-up line (rank 0) and its step lines.
STARTUP = re.compile(
    r"startup: (?:launch (?P<launch>[\d.]+)s, )?process group (?P<rendezvous>[\d.]+)s, data (?P<data>[\d.]+)s, "
    r"model (?P<model>[\d.]+)s, checkpoint (?P<load>[\d.]+)s"
)
STEP = re.compile(r"^step \d+ loss \S+ step_time (?P<ms>\d+)ms")
PHASES = ("detect", "fence", "agents", "launch", "rendezvous", "data", "model", "load", "first_step")


def breakdown(run_dir: Path, inc: dict[str, Any], failed: float) -> dict[str, float | None]:
    """Where a recovery's time went, from the logs: detection and the controller's decision (the
    incident), until the last agent has started its workers (the agents' logs), then rank 0's
    start-up as the example prints it: launch (the fork and the script's imports), the process
    group, the data loader, the model, the checkpoint load, the first step. Rank 0 starts before
    the last agent's workers, so the phases overlap a little and need not add up to the total."""
    out: dict[str, float | None] = dict.fromkeys(PHASES)
    out["detect"] = inc["detected_at"] - failed
    if inc.get("restarted_at"):
        out["fence"] = inc["restarted_at"] - inc["detected_at"]
    generation = inc["generation"] + 1
    started = [
        record["ts"]
        for log in run_dir.glob("nodes/*/agent.log")
        for line in log.read_text().splitlines()
        if '"workers started"' in line and (record := json.loads(line)).get("generation") == generation
    ]
    if started and inc.get("restarted_at"):
        out["agents"] = max(started) - inc["restarted_at"]
    rank0 = next(run_dir.glob(f"nodes/*/gen-{generation:04d}/rank-0.log"), None)
    lines = rank0.read_text().splitlines() if rank0 is not None else []
    for line in lines:
        if (m := STARTUP.search(line)) is not None:
            out.update({k: float(v) for k, v in m.groupdict().items() if v is not None})
        elif (m := STEP.match(line)) is not None:
            out["first_step"] = int(m["ms"]) / 1000
            break
    return out


def median_phases(rows: list[dict[str, Any]], name: str) -> dict[str, float]:
    out = {}
    for phase in PHASES:
        values = [
            r["phases"][phase] for r in rows if r["scenario"] == name and (r.get("phases") or {}).get(phase) is not None
        ]
        if values:
            out[phase] = statistics.median(values)
    return out


def _phases_line(phases: Mapping[str, float | None]) -> str:
    return "  ".join(f"{k} {v:.2f}" for k, v in phases.items() if v is not None)


def _warm_starts(run_dir: Path) -> int:
    """Workers started from warm processes, from the agents' logs."""
    total = 0
    for log in run_dir.glob("nodes/*/agent.log"):
        for line in log.read_text().splitlines():
            if '"workers started"' in line:
                total += json.loads(line).get("warm", 0)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=OUT)
    parser.add_argument(
        "--only",
        choices=["lost-node", "hot-swap"],
        default=None,
        help="lost-node: only the hot-swap/requeue pairs, not the detection scenarios; hot-swap: only the "
        "hot-swaps (no anchor, no ratio: for looking into their phases)",
    )
    parser.add_argument("--keep", type=Path, default=None, help="keep each run's folder (every log) under this folder")
    args = parser.parse_args()
    if args.only and args.output == OUT:
        parser.error(f"--only runs part of the benchmark: write it elsewhere than {OUT} (--output)")
    # The job files are written to a temporary folder; their code stays in examples/ (docs/security.md).
    os.environ[ALLOWED_PATHS_ENV] = str(EXAMPLE.parent)
    subprocess.run(
        [
            "make",
            "-s",
            "-C",
            str(REPO),
            "examples/data/shards/stories-00000.stok",
            "examples/data/shards/logs-00000.stok",
        ],
        check=True,
    )
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="stalwart-bench-recovery-") as tmp:
        root = Path(tmp) if args.keep is None else args.keep

        def scenario(name: str, *inject: str, **kw: Any) -> dict[str, Any]:
            folder = root / f"{name.replace('/', '-')}-{len(rows)}"
            folder.mkdir(parents=True)
            row = run(name, job_file(folder, **kw), folder, *inject)
            rows.append(row)
            return row

        print("recovery from a lost node, time after the failure (s):")
        for _ in range(args.repeats):
            scenario("lost-node/hot-swap", "kill-node:node=1,step=60")
            if args.only != "hot-swap":
                scenario("lost-node/requeue", "kill-node:node=1,step=60", requeue=True)
        if args.only is None:
            print("detection latency per class:")
            scenario("silent-node", "freeze-node:node=1,step=60")
            scenario("worker-crash", "kill-worker:rank=3,step=60")
            scenario("hang", "hang-worker:rank=1,step=60", ft={"hangTimeoutFloorSeconds": 4})
            scenario("nan", args=["--nan-at-step", "65"])
            scenario("slowdown", "slow-worker:rank=3,step=60", ft={"slowdownFactor": 2})

    def med(name: str, key: str) -> float | None:
        values = [r[key] for r in rows if r["scenario"] == name and r.get(key) is not None]
        return statistics.median(values) if values else None

    hot, req = med("lost-node/hot-swap", "first_step"), med("lost-node/requeue", "first_step")
    hot_after, req_after = med("lost-node/hot-swap", "after_detect"), med("lost-node/requeue", "after_detect")
    measured = {
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.platform()}",
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": "python bench/bench_recovery.py"
        + (f" --repeats {args.repeats}" if args.repeats != 3 else "")
        + (f" --only {args.only}" if args.only else ""),
        "hot_swap_seconds": hot,
        "requeue_seconds": req,
        "hot_swap_after_detection_seconds": hot_after,
        "requeue_after_detection_seconds": req_after,
        "ratio": req / hot if req and hot else None,
        "ratio_after_detection": req_after / hot_after if req_after and hot_after else None,
        "detect_seconds": {
            "WorkerCrash": med("worker-crash", "detect"),
            # The simulator reads LostNode: the silent machine (lease TTL), the slower of the two.
            "LostNode": med("silent-node", "detect"),
            "LostNode (its processes died)": med("lost-node/hot-swap", "detect"),
            "Hang": med("hang", "detect"),
            "NaNLoss": med("nan", "detect"),
            "Slowdown": med("slowdown", "detect"),
        },
        "hang_diagnosis_seconds": med("hang", "diagnose"),
        "runs": rows,
    }
    measured["hot_swap_phases_median"] = median_phases(rows, "lost-node/hot-swap")
    measured["not_measured"] = [k for k, v in measured["detect_seconds"].items() if v is None]
    measured["detect_seconds"] = {k: v for k, v in measured["detect_seconds"].items() if v is not None}
    args.output.write_text(json.dumps(measured, indent=2) + "\n")
    print()
    print("| | hot-swap | requeue | ratio |")
    print("|---|---|---|---|")
    print(f"| failure -> first step (s) | {_s(hot)} | {_s(req)} | {_x(measured['ratio'])} |")
    print(
        f"| detection -> first step (s) | {_s(hot_after)} | {_s(req_after)} | {_x(measured['ratio_after_detection'])} |"
    )
    print(f"\nhot-swap, median per phase (s): {_phases_line(measured['hot_swap_phases_median'])}")
    if args.only is None:
        print()
        print("| class | detect (s) |")
        print("|---|---|")
        for cls, value in measured["detect_seconds"].items():
            print(f"| {cls} | {value:.2f} |")
        for cls in measured["not_measured"]:
            print(f"| {cls} | not measured (the scenario recorded no incident) |")
    print(f"\nwrote {args.output}")


def _s(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.2f}"


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.1f}x"


if __name__ == "__main__":
    main()
