"""Framework integrations: recovery time and step-time overhead, each against its own plain script.

    .venv/bin/python bench/bench_integrations.py                      # every integration
    .venv/bin/python bench/bench_integrations.py --only huggingface --repeats 1

Every figure comes from a real `stalwart run` of the integration's example job (2 nodes x 2 gloo
workers, real etcd, agents and controller):

- recovery: a worker killed, and a node killed with a standby: failure -> the first completed step
  after the restart, from the incident the controller recorded in the run's summary;
- overhead: the step time of the example with the integration against the same script with the
  integration off (`--without-stalwart`), both under `stalwart run`, alternated, the first steps
  (imports, warm-up) left out; the step time is the script's own clock (one TrainerCallback or the
  like, the same in both modes). Twice: with no checkpoints in either (what every step pays), and
  with checkpoints every 10 steps in both, Stalwart's against the framework's own (overhead_rows).

One function per integration returns its rows; a shared runner runs the jobs and a shared writer
puts each integration's section into bench/results/integrations.md, keeping the other sections.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stalwart.spec import ALLOWED_PATHS_ENV

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
REPORT = REPO / "bench" / "results" / "integrations.md"
WARMUP_STEPS = 20  # left out of the step-time medians: imports, the first checkpoint's setup


@dataclass
class Row:
    """One configuration of one integration: what was run and what it measured."""

    integration: str
    configuration: str
    seconds: list[float] = field(default_factory=list)  # recovery: failure -> first step; overhead: medians
    note: str = ""


# ------------------------------------------------------------------------------------------ runner
def job_variant(
    job: Path, folder: Path, *, command: list[str] | None = None, standbys: int = 0, interval: int | None = None
) -> Path:
    """`job` with its paths made absolute, its command replaced if asked, `standbys` standbys and, if
    given, Stalwart's checkpoint interval."""
    doc = yaml.safe_load(job.read_text())
    if interval is not None:
        doc["spec"].setdefault("checkpoint", {})["intervalSteps"] = interval
    role = doc["spec"]["roles"][0]
    if command is not None:
        role["command"] = command
    role["workingDir"] = str((job.parent / role.get("workingDir", ".")).resolve())
    for source in doc["spec"]["data"]["sources"]:
        source["shards"] = [str((job.parent / s).resolve()) for s in source["shards"]]
    doc["spec"]["faultTolerance"].update({"preflight": False, "slowdownFactor": 10})
    doc["spec"]["standbys"] = {"count": standbys}
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_job(job: Path, folder: Path, *inject: str, timeout: float = 600) -> dict[str, Any]:
    """A `stalwart run` of `job`; its JSON summary (the run's logs stay in folder/run)."""
    summary = folder / "summary.json"
    argv = [sys.executable, "-m", "stalwart.cli.main", "run", str(job), "--workdir", str(folder / "run")]
    argv += ["--summary-json", str(summary), "--timeout", str(timeout)]
    for fault in inject:
        argv += ["--inject", fault]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 60)
    if proc.returncode != 0 or not summary.exists():
        raise RuntimeError(
            f"{shlex.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(summary.read_text())
    return result


def recovery_seconds(result: dict[str, Any]) -> tuple[float, str]:
    """Failure (the fault's firing, else the incident's failure time) -> first completed step after,
    and where it went (detected, restarted: seconds after the failure)."""
    [incident] = result["snapshot"]["incidents"]
    failed = result["faults"][0]["fired_at"] if result.get("faults") else incident["failed_at"]
    if incident.get("first_step_at") is None:
        raise RuntimeError(f"the incident has no first step after the restart: {incident}")
    where = f"detected {incident['detected_at'] - failed:.2f} s, restarted {incident['restarted_at'] - failed:.2f} s"
    return float(incident["first_step_at"] - failed), f"{where}, resumed at step {incident['resumed_step']}"


def step_times(run_dir: Path) -> list[float]:
    """Rank 0's step times as the example printed them (`STEP_TIMES {json}` in its log)."""
    for log in sorted(run_dir.glob("nodes/*/gen-*/rank-0.log")):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("STEP_TIMES "):
                return [float(t) for t in json.loads(line.removeprefix("STEP_TIMES "))["step_times"]]
    raise RuntimeError(f"no STEP_TIMES line in rank 0's log under {run_dir}")


def machine_load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} / {fifteen:.2f} on {os.cpu_count()} CPUs"


# -------------------------------------------------------------------------------- integrations
FAULTS = (("kill-worker:rank=1,step=15", 0), ("kill-node:node=1,step=15", 1))  # (fault, standbys)


def recovery_rows(name: str, job: Path, root: Path, repeats: int) -> list[Row]:
    """Failure -> first step after the restart, for a killed worker and for a lost node (one standby)."""
    rows = [
        Row(name, "recovery, worker killed (kill-worker:rank=1,step=15)"),
        Row(name, "recovery, node killed, 1 standby (kill-node:node=1,step=15)"),
    ]
    for i in range(repeats):
        for row, (fault, standbys) in zip(rows, FAULTS, strict=True):
            folder = root / f"{name}-recovery-{standbys}-{i}"
            folder.mkdir(parents=True)
            seconds, where = recovery_seconds(run_job(job_variant(job, folder, standbys=standbys), folder, fault))
            row.seconds.append(seconds)
            row.note = f"{row.note}; {where}" if row.note else where
    return rows


@dataclass(frozen=True)
class Anchor:
    """How an integration's example runs without Stalwart: its label, and the flag that makes the
    framework checkpoint by itself every N steps (what a team without Stalwart would configure)."""

    integration: str
    framework: str
    checkpoint_flag: str


def overhead_rows(name: str, job: Path, script: str, root: Path, repeats: int, anchor: Anchor) -> list[Row]:
    """The step time of the example with the integration against the same script without it
    (`--without-stalwart`), alternated, under `stalwart run`, in two configurations:

    - per step, no checkpoints in either (Stalwart's interval beyond the run): what the integration
      adds to every step (progress, phases, data position); the median step;
    - checkpoints every 10 steps in both: Stalwart's asynchronous save to its tiers against the
      framework's own checkpointing at the same interval; the mean step, which holds the saves.
    """
    steps, every = 200, 10
    command = ["python", script, "--steps", str(steps)]
    rows = {
        key: Row(name, label)
        for key, label in {
            "plain": f"step, {anchor.framework} --without-stalwart, no checkpoints ({steps} steps, median after "
            f"{WARMUP_STEPS})",
            "stalwart": f"step, {anchor.integration}, no checkpoints (same)",
            "plain-ckpt": f"step, {anchor.framework} --without-stalwart, its own checkpoint every {every} steps "
            f"({anchor.checkpoint_flag} {every}; mean after {WARMUP_STEPS})",
            "stalwart-ckpt": f"step, {anchor.integration}, Stalwart's checkpoint every {every} steps (same)",
        }.items()
    }
    for i in range(repeats):
        for key in rows:  # alternated: every configuration once per repeat
            folder = root / f"{name}-steps-{key}-{i}"
            folder.mkdir(parents=True)
            extra = ["--without-stalwart"] if key.startswith("plain") else []
            if key == "plain-ckpt":
                extra += [anchor.checkpoint_flag, str(every), *checkpoint_folder(script, folder)]
            interval = every if key.endswith("ckpt") else steps * 10
            run_job(job_variant(job, folder, command=command + extra, interval=interval), folder)
            times = step_times(folder / "run")[WARMUP_STEPS:]
            rows[key].seconds.append(statistics.mean(times) if key.endswith("ckpt") else statistics.median(times))
    for plain, stalwart, what in (("plain", "stalwart", "overhead"), ("plain-ckpt", "stalwart-ckpt", "against")):
        ratio = statistics.median(rows[stalwart].seconds) / statistics.median(rows[plain].seconds) - 1
        rows[stalwart].note = f"{what} {ratio * 100:+.1f}%" + (" (goal: under 1%)" if what == "overhead" else "")
    return list(rows.values())


def checkpoint_folder(script: str, folder: Path) -> list[str]:
    """The example's flag that puts the framework's own checkpoints in the run's folder."""
    flag = "--checkpoint-dir" if script == "hf_trainer.py" else "--checkpoints"
    return [flag, str(folder / "framework-checkpoints")]


def bench_huggingface(root: Path, repeats: int) -> list[Row]:
    """The Trainer example (examples/hf-trainer.yaml): recovery, and overhead against a plain Trainer
    (which reads the same shards through its own DataLoader and sampler, so the data path differs too)."""
    anchor = Anchor("StalwartTrainer", "plain Trainer", "--trainer-checkpoints")
    return [
        *recovery_rows("huggingface", EXAMPLES / "hf-trainer.yaml", root, repeats),
        *overhead_rows("huggingface", EXAMPLES / "hf-trainer.yaml", "hf_trainer.py", root, repeats, anchor),
    ]


def bench_lightning(root: Path, repeats: int) -> list[Row]:
    """The Lightning example (examples/lightning-tiny.yaml): recovery, and overhead against the same
    script without StalwartCallback (`--without-stalwart`: the same model, data and Trainer)."""
    anchor = Anchor("StalwartCallback", "the same Trainer", "--lightning-checkpoints")
    return [
        *recovery_rows("lightning", EXAMPLES / "lightning-tiny.yaml", root, repeats),
        *overhead_rows("lightning", EXAMPLES / "lightning-tiny.yaml", "lightning_tiny.py", root, repeats, anchor),
    ]


def bench_dcp(root: Path, repeats: int) -> list[Row]:
    """The plain DCP example (examples/dcp-tiny.yaml): recovery only. Its integration is the storage
    writer, whose cost is the loop's blocked time per save: bench/bench_dcp_tiers.py measures it."""
    return recovery_rows("dcp", EXAMPLES / "dcp-tiny.yaml", root, repeats)


INTEGRATIONS: dict[str, Callable[[Path, int], list[Row]]] = {
    "huggingface": bench_huggingface,
    "lightning": bench_lightning,
    "dcp": bench_dcp,
}


# ------------------------------------------------------------------------------------------ report
def section(name: str, rows: list[Row], command: str, load_before: str, load_after: str) -> str:
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"<!-- integration: {name} -->",
        f"## {name}",
        "",
        f"Measured {date} on {platform.node()} ({platform.machine()}): `{command}`.",
        f"Machine before: {load_before}; after: {load_after}.",
        "",
        "| configuration | median (s) | runs (s) | note |",
        "| --- | --- | --- | --- |",
    ]
    for row in rows:
        runs = ", ".join(f"{s:.4f}" if s < 1 else f"{s:.2f}" for s in row.seconds)
        median = statistics.median(row.seconds)
        lines.append(f"| {row.configuration} | {median:.4f} | {runs} | {row.note} |")
    return "\n".join(lines) + "\n"


def write_report(sections: dict[str, str], path: Path = REPORT) -> None:
    """Replace the named integrations' sections of the report, keeping the others as they were."""
    header = "# Framework integrations: recovery and overhead\n\nWritten by `bench/bench_integrations.py`.\n"
    kept: dict[str, str] = {}
    if path.exists():
        for match in re.finditer(r"<!-- integration: (\S+) -->\n.*?(?=<!-- integration: |\Z)", path.read_text(), re.S):
            kept[match.group(1)] = match.group(0).rstrip("\n") + "\n"
    kept.update(sections)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + "".join(f"\n{kept[name]}" for name in sorted(kept)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(INTEGRATIONS), action="append", default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args()
    os.environ[ALLOWED_PATHS_ENV] = str(EXAMPLES)  # the job files are elsewhere; their code is in examples/
    command = shlex.join(["python", "bench/bench_integrations.py", *sys.argv[1:]])
    sections = {}
    with tempfile.TemporaryDirectory(prefix="stalwart-bench-integrations-") as tmp:
        for name in args.only or sorted(INTEGRATIONS):
            load_before = machine_load()
            rows = INTEGRATIONS[name](Path(tmp) / name, args.repeats)
            sections[name] = section(name, rows, command, load_before, machine_load())
            print(sections[name], flush=True)
    write_report(sections, args.report)


if __name__ == "__main__":
    main()
