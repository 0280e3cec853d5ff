"""The anchor of bench_stragglers.py: NVIDIA Resiliency Extension's straggler scoring on CPU.

Runs as one rank of a gloo world (torchrun environment), in NVRx's own virtual environment. NVRx's
`straggler.Detector.initialize` loads its CUPTI extension, which needs CUDA's libcupti (on this
machine: "ImportError: libcupti.so.12: cannot open shared object file"), so its CUDA kernel scores
cannot run here. Its section scores can: this script times the sections NVRx would wrap (data,
compute with DDP's all-reduce, optimizer, the rest of the step) itself, summarizes them with NVRx's
own statistics and hands them to NVRx's own `ReportGenerator` every `--report-every` steps, then
asks `Report.identify_stragglers(section_rel_threshold=0.75)` (NVRx's documented default) who
straggles. Every rank also writes its per-step section times, so that the bench scores the very
same steps with Stalwart's scoring.

The slowdown is injected at `--fault-step` into `--fault-rank` (a comma-separated list): `--fault`
data|optimizer|host adds `(factor - 1) x` the rank's median step time before the fault to that
section ("host": outside every section, before the next collective, as `slow-worker` does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from nvidia_resiliency_ext.straggler.reporting import ReportGenerator
from nvidia_resiliency_ext.straggler.statistics import Statistic

SECTIONS = ("data", "compute", "optimizer", "other")


def summary(times: list[float]) -> dict[Statistic, float]:
    return {
        Statistic.MIN: min(times),
        Statistic.MAX: max(times),
        Statistic.MED: statistics.median(times),
        Statistic.AVG: statistics.fmean(times),
        Statistic.STD: statistics.pstdev(times),
        Statistic.NUM: float(len(times)),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--fault", choices=("none", "data", "optimizer", "host"), default="none")
    p.add_argument("--fault-rank", default="")
    p.add_argument("--fault-step", type=int, default=60)
    p.add_argument("--factor", type=float, default=1.5)
    p.add_argument("--report-every", type=int, default=20)
    p.add_argument("--step-delay", type=float, default=0.03)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    faulty = {int(r) for r in args.fault_rank.split(",") if r}
    generator = ReportGenerator(
        scores_to_compute=["relative_perf_scores", "individual_perf_scores"], node_name=f"node-{rank // 2}"
    )
    window: dict[str, list[float]] = {s: [] for s in SECTIONS}
    steps: list[dict[str, float]] = []
    delay = 0.0
    named: list[dict[str, object]] = []
    t_step = time.perf_counter()
    for step in range(1, args.steps + 1):
        if step == args.fault_step and rank in faulty:
            delay = (args.factor - 1) * statistics.median(s["wall"] for s in steps[-20:])
        slow = rank in faulty and step >= args.fault_step
        t0 = time.perf_counter()
        x = torch.randn(32, 256)
        if slow and args.fault == "data":
            time.sleep(delay)
        t1 = time.perf_counter()
        loss = model(x).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        t2 = time.perf_counter()
        if slow and args.fault == "optimizer":
            time.sleep(delay)
        optim.step()
        t3 = time.perf_counter()
        time.sleep(args.step_delay)
        if slow and args.fault == "host":
            time.sleep(delay)
        t4 = time.perf_counter()
        times = {"data": t1 - t0, "compute": t2 - t1, "optimizer": t3 - t2, "other": t4 - t3}
        steps.append({**times, "step": step, "wall": t4 - t_step, "at": time.time()})
        t_step = t4
        for s in SECTIONS:
            window[s].append(times[s])
        if step % args.report_every == 0:
            report = generator.generate_report({s: summary(v) for s, v in window.items()}, {})
            window = {s: [] for s in SECTIONS}
            if rank == 0 and report is not None:
                found = report.identify_stragglers(section_rel_threshold=0.75, section_indiv_threshold=0.75)
                rel = {s: sorted({i.rank for i in ids}) for s, ids in found["straggler_sections_relative"].items()}
                scores = {
                    s: {str(r): round(v, 3) for r, v in d.items()}
                    for s, d in report.section_relative_perf_scores.items()
                }
                named.append({"step": step, "at": time.time(), "relative": rel, "scores": scores})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"steps-{rank}.json").write_text(json.dumps(steps))
    if rank == 0:
        (args.out / "nvrx.json").write_text(json.dumps(named))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
