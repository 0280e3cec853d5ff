"""`stalwart run` as the end-to-end tests drive it: a job file made from a test job with overrides,
the real command in a subprocess, its JSON summary, and no process left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from support.orphans import cmdline, started_since, tagged_processes


def job_variant(
    job: Path,
    tmp_path: Path,
    *,
    args: list[str] = (),  # type: ignore[assignment]
    fault_tolerance: dict[str, Any] | None = None,
    failure_policy: dict[str, Any] | None = None,
    standbys: int | None = 0,
) -> Path:
    """`job` with extra worker arguments or policy settings, its relative paths made absolute,
    written where the test can use it."""
    doc = yaml.safe_load(job.read_text())
    role = doc["spec"]["roles"][0]
    role["command"] += list(args)
    role["workingDir"] = str((job.parent / role["workingDir"]).resolve())
    for source in doc["spec"]["data"]["sources"]:
        source["shards"] = [str((job.parent / s).resolve()) for s in source["shards"]]
    doc["spec"]["faultTolerance"].update(fault_tolerance or {})
    doc["spec"]["failurePolicy"].update(failure_policy or {})
    if standbys is not None:
        doc["spec"]["standbys"] = {"count": standbys}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_job(
    tmp_path: Path,
    stalwart_cmd: list[str],
    job: Path,
    *inject: str,
    timeout: float = 240,
    options: Sequence[str] = (),
) -> tuple[int, dict[str, Any], str]:
    """(exit code, the run's JSON summary, its output); fails if the run left a process behind.
    `options`: more `stalwart run` options (`--max-nodes 2`)."""
    summary = tmp_path / "summary.json"
    argv = [
        *stalwart_cmd,
        "run",
        str(job),
        "--workdir",
        str(tmp_path / "run"),
        "--summary-json",
        str(summary),
        "--timeout",
        str(timeout),
    ]
    for fault in inject:
        argv += ["--inject", fault]
    argv += list(options)
    before = {p.pid for p in tagged_processes()}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 60)
    output = proc.stdout + proc.stderr
    assert summary.exists(), output
    left = [cmdline(p) for p in started_since(before)]
    assert not left, f"stalwart run left processes behind: {left}"
    return proc.returncode, json.loads(summary.read_text()), output


def agent_log(run_dir: Path, node: str) -> list[dict[str, Any]]:
    """A node agent's structured log lines."""
    path = run_dir / "nodes" / node / "agent.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def run_audited(
    job: Path,
    tmp_path: Path,
    samples: Path,
    *inject: str,
    standbys: int = 0,
    fault_tolerance: dict[str, Any] | None = None,
    timeout: float = 240,
) -> tuple[int, dict[str, Any], str]:
    """`stalwart run` of an example that takes `--sample-log`, writing each step's sample ids to
    `samples` (worker_sdk.trained_samples reads them), with no pre-flight unless asked."""
    variant = job_variant(
        job,
        tmp_path,
        args=["--sample-log", str(samples)],
        fault_tolerance={"preflight": False, **(fault_tolerance or {})},
        standbys=standbys,
    )
    return run_job(tmp_path, [sys.executable, "-m", "stalwart.cli.main"], variant, *inject, timeout=timeout)
