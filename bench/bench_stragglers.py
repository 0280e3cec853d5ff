"""Straggler benchmark: a matrix of slowdowns on one rank (or one node), and healthy runs under CPU
noise, through the whole product; anchored on NVIDIA Resiliency Extension's straggler scores.

    .venv/bin/python bench/bench_stragglers.py                       # the matrix, 10 healthy runs, the anchor
    .venv/bin/python bench/bench_stragglers.py --factors 1.5 --kinds data --healthy 1 --no-anchor  # quick

System runs: each is a real `stalwart run` of the example job (2 nodes x 2 gloo workers, a warm
standby, real etcd, agents, controller) with the straggler detector's defaults (stragglerThreshold
0.8, stragglerWindowSeconds 30, stragglerWarmupSteps 20). At step 60 one rank turns slow by a
factor of its own step time (`factor=`): `host` (slow-worker: time outside the timed phases, before
its next collective, as a throttled host or slow compute shows), `data` (slow-data), `optimizer`
(slow-optimizer), or `node` (slow-worker on both ranks of node-1: a whole host). Reported: the
time from the fault to the decision (the incident's detection) and to the hot-swapped generation's
first step, the node named, the verdict's class, and false evictions (a node other than node-1).
Healthy runs: no fault, checkpoints every 10 steps, and a competing busy process at nice 0.

The anchor (`--nvrx-python`, a virtual environment with nvidia-resiliency-ext 0.4.1 and torch):
bench/peers/nvrx_stragglers.py runs a 4-rank gloo DDP loop with the same slowdowns and NVRx's own
ReportGenerator and identify_stragglers (section threshold 0.75, its documented default) on the
sections it times; the same steps are scored by Stalwart's scoring (straggler_scores.py).

Writes bench/results/bench_stragglers.md (and a JSON beside it).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from stalwart.controller.core.detectors.straggler_scores import Sample, score_group, slow_ranks
from stalwart.spec import ALLOWED_PATHS_ENV

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "pretrain-tiny.yaml"
PEER = REPO / "bench" / "peers" / "nvrx_stragglers.py"
RESULTS = REPO / "bench" / "results"
FAULT_STEP = 60
SLOWED_NODE = "node-1"  # where ranks 2 and 3 start
KEEP_FALSE_EVICTIONS: Path | None = None  # --keep-false-evictions: where a run that evicted wrongly is copied
KINDS = {
    "host": ["slow-worker:rank=3,step={step},factor={f}"],
    "data": ["slow-data:rank=3,step={step},factor={f}"],
    "optimizer": ["slow-optimizer:rank=3,step={step},factor={f}"],
    "node": ["slow-worker:rank=2,step={step},factor={f}", "slow-worker:rank=3,step={step},factor={f}"],
}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def job_file(folder: Path, steps: int) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    role = doc["spec"]["roles"][0]
    role["command"] = list(role["command"])
    role["command"][role["command"].index("--steps") + 1] = str(steps)
    role["workingDir"] = str(EXAMPLE.parent)
    for source in doc["spec"]["data"]["sources"]:
        source["shards"] = [str(EXAMPLE.parent / s) for s in source["shards"]]
    doc["spec"]["faultTolerance"].update(
        {"preflight": False, "heartbeatIntervalSeconds": 0.5, "leaseTtlSeconds": 5, "stopGraceSeconds": 2}
    )
    doc["spec"]["standbys"] = {"count": 1}
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def system_run(name: str, steps: int, inject: list[str], busy: bool, slowed: set[int] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-stragglers-") as tmp:
        folder = Path(tmp)
        summary = folder / "summary.json"
        argv = [sys.executable, "-m", "stalwart.cli.main", "run", str(job_file(folder, steps))]
        argv += ["--workdir", str(folder / "run"), "--summary-json", str(summary), "--timeout", "600"]
        for fault in inject:
            argv += ["--inject", fault]
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
        load_at_start = os.getloadavg()[0]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=700)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        wall = time.monotonic() - t0
        if not summary.exists():
            return {"run": name, "error": f"no summary: {proc.stderr[-500:]}"}
        result = json.loads(summary.read_text())
        if KEEP_FALSE_EVICTIONS is not None and _false_evictions(result["snapshot"]["incidents"], slowed or set()):
            _keep(folder, name)
    snap = result["snapshot"]
    fired = [f["fired_at"] for f in result.get("faults", [])]
    evicted = sorted({n for i in snap["incidents"] for n in i["evicted"]})
    out: dict[str, Any] = {
        "run": name,
        "phase": result["phase"],
        "steps": snap["step"],
        "wall": wall,
        "evicted": evicted,
        "false_evictions": _false_evictions(snap["incidents"], slowed or set()),
        "incidents": [i["failure_class"] for i in snap["incidents"]],
        "load": [round(load_at_start, 1), round(os.getloadavg()[0], 1)],  # 1-min load average, start and end
        # which detector blamed whom: a straggler verdict, the pace's rounds (slowdown), metric outliers...
        "blamed": [
            {
                "verdict": (i.get("verdict") or {}).get("failure_class"),
                "ranks": sorted(_ranks(i)),
                "why": i["evidence"][:2],
            }
            for i in snap["incidents"]
        ],
    }
    if fired and snap["incidents"]:
        inc = next((i for i in snap["incidents"] if i["detected_at"] >= min(fired)), snap["incidents"][0])
        verdict = inc.get("verdict") or {}
        out.update(
            named=inc["suspects"],
            ranks=sorted(_ranks(inc)),
            verdict=verdict.get("failure_class"),
            cause=(verdict.get("straggler") or {}).get("cause"),
            decision=inc["detected_at"] - min(fired),
            swapped=(inc["first_step_at"] - min(fired)) if inc.get("first_step_at") else None,
        )
    return out


def _keep(folder: Path, name: str) -> None:
    """A run that evicted a node it should not have: its logs and summary, for whoever looks into it
    (the etcd data and checkpoints are left behind)."""
    assert KEEP_FALSE_EVICTIONS is not None
    where = KEEP_FALSE_EVICTIONS / f"{name.replace(' ', '-')}-{datetime.datetime.now(datetime.UTC):%H%M%S}"
    shutil.copytree(folder, where, ignore=shutil.ignore_patterns("etcd", "checkpoints", "*.stok"))
    print(f"kept {where}", file=sys.stderr, flush=True)


def _ranks(incident: dict[str, Any]) -> set[int]:
    """The ranks an incident blames: its rank, and its verdict's suspects' ranks."""
    verdict = incident.get("verdict") or {}
    found = {r for s in verdict.get("suspects") or [] for r in s.get("ranks") or []}
    return found | ({incident["rank"]} if incident.get("rank") is not None else set())


def _false_evictions(incidents: list[dict[str, Any]], slowed: set[int]) -> list[str]:
    """Nodes evicted by an incident that blames none of the slowed ranks (a slot's node may be a
    replacement for one that did not join: the ranks, not the node names, tell). An incident that
    blames no rank (the pace's rounds may name a node alone) is judged by its node: the slowed
    ranks start on SLOWED_NODE."""
    false: set[str] = set()
    for i in incidents:
        ranks = _ranks(i)
        if not slowed or (ranks and not ranks & slowed):
            false.update(i["evicted"])
        elif not ranks:
            false.update(n for n in i["evicted"] if n != SLOWED_NODE)
    return sorted(false)


def anchor_run(python: str, fault: str, factor: float, steps: int, port: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-nvrx-") as tmp:
        out = Path(tmp) / "out"
        ranks = {"host": "3", "data": "3", "optimizer": "3", "node": "2,3", "none": ""}[fault]
        argv = [python, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-port", str(port), str(PEER)]
        argv += ["--steps", str(steps), "--fault", "host" if fault == "node" else fault, "--fault-rank", ranks]
        argv += ["--factor", str(factor), "--fault-step", str(FAULT_STEP), "--out", str(out)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return {"fault": fault, "factor": factor, "error": proc.stderr[-800:]}
        reports = json.loads((out / "nvrx.json").read_text())
        per_rank = {r: json.loads((out / f"steps-{r}.json").read_text()) for r in range(4)}
    faulty = {int(r) for r in ranks.split(",") if r}
    nvrx_named = [(rep["step"], {int(r) for ids in rep["relative"].values() for r in ids}) for rep in reports]
    ours = _our_scores(per_rank, faulty)
    first_nvrx = next((s for s, ids in nvrx_named if faulty and faulty <= ids and s >= FAULT_STEP), None)
    return {
        "fault": fault,
        "factor": factor,
        "nvrx_first_step": first_nvrx,
        "nvrx_false_ranks": sorted({r for _, ids in nvrx_named for r in ids} - faulty),
        "nvrx_sections": sorted({s for rep in reports for s in rep["relative"]}),
        **ours,
    }


def _our_scores(per_rank: dict[int, list[dict[str, float]]], faulty: set[int]) -> dict[str, Any]:
    """Stalwart's scoring on the same steps: each window of 20 steps, as the anchor's reports."""
    first, false_ranks, low = None, set(), []
    steps = min(len(s) for s in per_rank.values())
    for end in range(20, steps + 1, 20):
        history = {
            r: [Sample(int(s["step"]), {k: s[k] for k in ("data", "optimizer", "other")}) for s in rows[end - 20 : end]]
            for r, rows in per_rank.items()
        }
        scores = score_group(history, 20, min_samples=5)
        step_time = statistics.median(s["wall"] for rows in per_rank.values() for s in rows[end - 20 : end])
        slow = slow_ranks(scores, 0.8, step_time, 0.05)
        if faulty and end >= FAULT_STEP:
            low.append(min(scores[r].relative for r in faulty))
        if first is None and faulty and faulty <= set(slow) and end > FAULT_STEP:
            first = end
        false_ranks |= set(slow) - faulty
    return {
        "ours_first_step": first,
        "ours_false_ranks": sorted(false_ranks),
        "ours_score": round(statistics.median(low), 3) if low else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--factors", default="1.2,1.5,2,3")
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--healthy", type=int, default=10, help="healthy runs under CPU noise")
    p.add_argument("--steps", type=int, default=700, help="steps of each faulty run")
    p.add_argument("--healthy-steps", type=int, default=400)
    p.add_argument("--nvrx-python", default="/tmp/nvrx-venv/bin/python")
    p.add_argument("--no-anchor", action="store_true")
    p.add_argument("--anchor-kinds", default=",".join(KINDS), help="the anchor's slowdowns (each at 1.2x and 1.5x)")
    p.add_argument("--output", type=Path, default=RESULTS / "bench_stragglers.md")
    p.add_argument(
        "--keep-false-evictions",
        type=Path,
        help="copy the folder of each run that evicted a node it should not have here",
    )
    p.add_argument("--note", default="", help="a paragraph for the report's head (how the runs were split, the load)")
    p.add_argument(
        "--report-from",
        type=Path,
        nargs="+",
        help="write the report from runs' outputs (their JSON lines: an interrupted run, runs split in parts) "
        "instead of running",
    )
    args = p.parse_args()
    global KEEP_FALSE_EVICTIONS
    KEEP_FALSE_EVICTIONS = args.keep_false_evictions
    if args.report_from is not None:
        report_from(args)
        return
    os.environ[ALLOWED_PATHS_ENV] = str(EXAMPLE.parent)  # the job file lives in a temporary folder
    factors = [float(f) for f in args.factors.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    anchor_kinds = [k for k in args.anchor_kinds.split(",") if k]
    started = datetime.datetime.now(datetime.UTC)
    loads = [load()]
    rows: list[dict[str, Any]] = []
    for kind in kinds:
        for f in factors:
            inject = [t.format(step=FAULT_STEP, f=f) for t in KINDS[kind]]
            slowed = {2, 3} if kind == "node" else {3}
            row = {"kind": kind, "factor": f, **system_run(f"{kind} x{f}", args.steps, inject, False, slowed)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    loads.append(load())
    healthy: list[dict[str, Any]] = []
    for i in range(args.healthy):
        row = system_run(f"healthy {i + 1}", args.healthy_steps, [], busy=True)
        healthy.append(row)
        print(json.dumps(row), flush=True)
    loads.append(load())
    anchor: list[dict[str, Any]] = []
    if not args.no_anchor:
        if not Path(args.nvrx_python).exists():
            anchor.append({"error": f"{args.nvrx_python} does not exist: install nvidia-resiliency-ext there"})
        else:
            port = 29700
            for kind in anchor_kinds:
                for f in (1.2, 1.5):
                    port += 1
                    anchor.append(anchor_run(args.nvrx_python, kind, f, 160, port))
                    print(json.dumps(anchor[-1]), flush=True)
            anchor.append(anchor_run(args.nvrx_python, "none", 1.0 + 1e-9, 160, port + 1))
            print(json.dumps(anchor[-1]), flush=True)
        loads.append(load())
    write_report(args, started, loads, rows, healthy, anchor)


def report_from(args: argparse.Namespace) -> None:
    """The report of a run cut short: the rows its output printed, each a JSON line."""
    rows, healthy, anchor = [], [], []
    lines = [ln for path in args.report_from for ln in path.read_text().splitlines()]
    for line in lines:
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if "kind" in row and len(row.get("blamed") or []) == 1:  # judged again, by the rule of today's bench
            incident = {"evicted": row["evicted"], "verdict": {"suspects": [{"ranks": row["blamed"][0]["ranks"]}]}}
            row["false_evictions"] = _false_evictions([incident], {2, 3} if row["kind"] == "node" else {3})
        (rows if "kind" in row else healthy if str(row.get("run", "")).startswith("healthy") else anchor).append(row)
    started = datetime.datetime.fromtimestamp(min(p.stat().st_mtime for p in args.report_from), datetime.UTC)
    loads = [f"{load()} when the report was written (each run's own readings are in its row)"]
    write_report(args, started, loads, rows, healthy, anchor)


def _steps_of(runs: list[dict[str, Any]]) -> str:
    """How many runs reached how many steps: '2 of 400 steps, 8 of 250 steps'."""
    counts = collections.Counter(r.get("steps") for r in runs)
    return ", ".join(f"{n} of {steps} steps" for steps, n in sorted(counts.items(), key=lambda kv: -(kv[0] or 0)))


def _load(row: dict[str, Any]) -> str:
    return "-".join(f"{x:g}" for x in row["load"]) if row.get("load") else "not recorded"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def write_report(
    args: argparse.Namespace,
    started: datetime.datetime,
    loads: list[str],
    rows: list[dict[str, Any]],
    healthy: list[dict[str, Any]],
    anchor: list[dict[str, Any]],
) -> None:
    argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--note" and (i == 0 or sys.argv[i] != "--note")]
    cmd = " ".join(["python bench/bench_stragglers.py", *argv])
    lines = [
        "# Straggler detection: the matrix, healthy runs, and NVRx's scores",
        "",
        f"Measured {started:%Y-%m-%d %H:%M} UTC by `{cmd}` on {platform.node()} ({os.cpu_count()} CPUs, "
        f"{platform.python_version()}), a machine shared with other work: {'; '.join(loads)}"
        + (" (before the matrix, after it, after the healthy runs, after the anchor)." if len(loads) > 1 else "."),
        "",
        *([args.note, ""] if args.note else []),
        "## Slowdowns through the product",
        "",
        "The example job (`examples/pretrain-tiny.yaml`: 2 nodes x 2 gloo workers, a warm standby), the straggler "
        f"detector's defaults, one slowdown from step {FAULT_STEP} on rank 3 (node-1; `node`: ranks 2 and 3). "
        "Decision: fault to incident; swapped: fault to the hot-swapped generation's first step.",
        "",
        "| slowdown | factor | outcome | node named | ranks blamed | verdict | cause | decision (s) | swapped (s) | "
        "false evictions | load (1 min, start-end) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kind']} | {r['factor']:g}x | {r.get('phase', r.get('error', '-'))}, step {r.get('steps', '-')} | "
            f"{', '.join(r.get('named') or []) or 'none'} | {r.get('ranks', 'not recorded')} | "
            f"{r.get('verdict') or '-'} | {r.get('cause') or '-'} | "
            f"{_s(r.get('decision'))} | {_s(r.get('swapped'))} | "
            f"{', '.join(r.get('false_evictions') or []) or 'none'} | {_load(r)} |"
        )
    if any("ranks" not in r for r in rows):
        lines += [
            "",
            "Rows whose blamed ranks were not recorded (measured before the bench kept them) count an eviction "
            "of any node but node-1 as false. Under this load a node that did not join in time is replaced at "
            "start-up (node-3, node-4...), and the slowed rank then runs there: a verdict naming the slowed "
            "phase on such a node is the slowed rank's, not a false eviction, but these rows cannot show it.",
        ]
    evictions = sum(len(h.get("evicted") or []) for h in healthy)
    lines += [
        "",
        "## Healthy runs under CPU noise",
        "",
        f"{len(healthy)} runs ({_steps_of(healthy)}), no fault, "
        "checkpoints every 10 steps, a competing busy "
        f"process at nice 0 for each whole run: **{evictions} eviction(s)**, incidents: "
        + (", ".join(f"{h['run']}: {h['incidents']}" for h in healthy if h.get("incidents")) or "none")
        + ". Outcomes: "
        + ", ".join(f"{h.get('phase', h.get('error'))}" for h in healthy)
        + ".",
        "",
        "1-min load average at each run's start and end: "
        + (", ".join(f"{h['run']} {_load(h)}" for h in healthy) or "none")
        + ".",
        "",
        *[f"- {h['run']}: {b}" for h in healthy for b in h.get("blamed") or []],
        "",
        "## The anchor: NVIDIA Resiliency Extension 0.4.1 on the same steps",
        "",
        "NVRx's `straggler.Detector.initialize` cannot run on this CPU machine: it loads its CUPTI extension "
        "(`ImportError: libcupti.so.12: cannot open shared object file`), so its CUDA kernel scores are out. Its "
        "section scores run: bench/peers/nvrx_stragglers.py times data, compute (forward and backward, DDP's "
        "all-reduce inside), optimizer and the rest of each step on 4 gloo ranks, feeds them to NVRx's "
        "`ReportGenerator` every 20 steps and asks `identify_stragglers(section_rel_threshold=0.75)` (its "
        "default). Stalwart's scoring (own work: data, optimizer, other; threshold 0.8, 5% of the step) scores "
        "the same 20-step windows. First step: the first report (every 20 steps) naming every slowed rank.",
        "",
        "| slowdown | factor | NVRx first step | NVRx sections flagged | NVRx false ranks | Stalwart first step | "
        "Stalwart score of the slowed rank | Stalwart false ranks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in anchor:
        if "error" in a:
            lines.append(f"| {a.get('fault', '-')} | {a.get('factor', '-')} | error: {a['error'][-200:]!r} | | | | | |")
            continue
        lines.append(
            f"| {a['fault']} | {a['factor']:.3g}x | {a['nvrx_first_step'] or 'never'} | "
            f"{', '.join(a['nvrx_sections']) or 'none'} | {a['nvrx_false_ranks'] or 'none'} | "
            f"{a['ours_first_step'] or 'never'} | {a['ours_score'] if a['ours_score'] is not None else '-'} | "
            f"{a['ours_false_ranks'] or 'none'} |"
        )
    lines += [
        "",
        "NVRx flags every section below 0.75 of the fastest rank's median, compute included: where compute holds "
        "DDP's all-reduce, the healthy ranks wait there for the slow one, and their compute scores fall (its "
        "`compute` false ranks above). Stalwart leaves compute and comm out of a rank's own work for that reason, "
        "and compares with the peers' median, not the fastest rank.",
        "",
    ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines))
    args.output.with_suffix(".json").write_text(
        json.dumps({"matrix": rows, "healthy": healthy, "anchor": anchor, "load": loads}, indent=1)
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
