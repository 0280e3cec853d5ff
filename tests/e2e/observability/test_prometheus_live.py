"""A real Prometheus (Debian's package) on loopback scrapes a real `stalwart run` job that loses a
node: every dashboard panel's query returns series (with Grafana's variables as a user sets them:
`$__rate_interval`, the namespace and the job), queries by training_job work, and the incident
counter shows the fault. The machine has no GPU: the agents' GPU probe reads `nvidia-smi -q` output
recorded on an H100 (tests/data/health), through an `nvidia-smi` on the job's PATH that prints it,
so the GPU panels have their series. One job, one Prometheus, every assertion in this module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.paths import REPO

from stalwart.net import free_port
from stalwart.processes import spawn, stop_process, wait_for

JOB = "pretrain-tiny"
DASHBOARD = REPO / "charts" / "stalwart" / "dashboards" / "stalwart.json"
RECORDED_SMI = REPO / "tests" / "data" / "health" / "nvidia-smi" / "h100-80gb-hbm3-driver-580.txt"
# What Grafana puts in the queries: All namespaces (the variable's allValue), this job, and a
# $__rate_interval of at least 4 scrapes (1 s here).
VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$job": JOB}


def grafana_expr(expr: str, variables: dict[str, str] = VARIABLES) -> str:
    for name, value in variables.items():
        expr = expr.replace(name, value)
    return expr


def recorded_gpu_path(bin_dir: Path) -> str:
    """A PATH whose `nvidia-smi` prints the recorded H100 output (`-q` is all the probe asks)."""
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec cat {RECORDED_SMI}\n")
    smi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


class Live:
    def __init__(self, url: str, run: subprocess.Popen[bytes], workdir: Path, http: httpx.Client) -> None:
        self.url, self.run, self.workdir, self.http = url, run, workdir, http

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = self.http.get(f"{self.url}/api/v1/query", params={"query": expr}).json()
        assert answer["status"] == "success", (expr, answer)
        return answer["data"]["result"]  # type: ignore[no-any-return]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else float("nan")

    def wait(self, what: str, check: Any, limit: float = 600) -> None:
        """Until `check()` holds (bounded: a job that never gets there fails the test, with its logs)."""
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if check():
                return
            assert self.run.poll() is None, f"the job ended before {what}; see {self.workdir}"
            time.sleep(0.5)
        pytest.fail(f"timed out waiting for {what}; see {self.workdir}")


def _wait_ready(http: httpx.Client, url: str, server: subprocess.Popen[bytes], log: Path, limit: float = 120) -> None:
    """Until Prometheus answers its readiness endpoint (it opens its port after loading its TSDB)."""

    def ready() -> bool:
        assert server.poll() is None, f"prometheus exited ({server.returncode}):\n{log.read_text()[-3000:]}"
        try:
            return http.get(f"{url}/-/ready").status_code == 200
        except httpx.TransportError:
            return False

    if not wait_for(ready, limit, interval=0.2):
        pytest.fail(f"prometheus not ready after {limit:.0f} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def live(example_shards: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is missing: `make install` installs Debian's package (as root)"
    tmp = tmp_path_factory.mktemp("prom")
    workdir = tmp / "run"
    workdir.mkdir()
    config = tmp / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: stalwart\n"
        f"    file_sd_configs: [{{files: ['{workdir}/prometheus-targets.json'], refresh_interval: 1s}}]\n"
    )
    port = free_port()
    with open(tmp / "prometheus.log", "wb") as log:
        server = spawn(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    with open(tmp / "run.out", "wb") as out:
        run = spawn(
            [
                sys.executable,
                "-m",
                "stalwart.cli.main",
                "run",
                str(REPO / "examples" / "pretrain-tiny.yaml"),
                "--workdir",
                str(workdir),
                "--inject",
                "kill-node:node=1,step=30",
                "--timeout",
                "300",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PATH": recorded_gpu_path(tmp / "gpu-bin"), "STALWART_PROBE_INTERVAL": "2"},
        )
    # One client for the whole module: each `httpx.get` builds a TLS context (the CA bundle read
    # again), which made this module's polling 9 CPU-seconds of the end-to-end run.
    try:
        with httpx.Client(timeout=10) as http:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(http, url, server, tmp / "prometheus.log")
            yield Live(url, run, workdir, http)
    finally:
        stop_process(run, grace=30.0)
        stop_process(server, grace=10.0)


def test_the_fault_shows_and_every_panel_returns_series(live: Live) -> None:
    sel = f'training_job="{JOB}"'
    live.wait("Prometheus scraping the job", lambda: live.query(f"stalwart_job_phase{{{sel}}}"))
    # The injected node loss is recorded, recovered (a hot-swap) and training goes on after it.
    live.wait(
        "the lost node's incident to be recovered",
        lambda: live.value(f'stalwart_job_recovery_duration_seconds_count{{{sel},failure_class="LostNode"}}') >= 1,
    )
    live.wait("training past the fault", lambda: live.value(f"stalwart_job_step{{{sel}}}") >= 45)
    live.wait(
        "a second load and save after the restart",
        lambda: live.query("stalwart_checkpoint_load_duration_seconds_count"),
    )
    assert live.value(f'stalwart_job_incidents_total{{{sel},failure_class="LostNode"}}') >= 1
    assert live.value(f"sum(stalwart_job_evictions_total{{{sel}}})") >= 1
    # Queries by training_job work on the agents' series too (not renamed exported_job).
    assert live.query(f"stalwart_worker_step{{{sel}}}")
    assert not live.query('{exported_job!=""}')
    live.wait("the GPU probe's readings", lambda: live.query(f"stalwart_node_gpu_temperature_celsius{{{sel}}}"))
    model = json.loads(DASHBOARD.read_text())
    empty = []
    for panel in model["panels"]:
        for target in panel.get("targets", []):
            expr = grafana_expr(target["expr"])
            assert "$" not in expr, expr  # every variable the dashboard uses is one Grafana fills in
            if not live.query(expr):
                empty.append(f"{panel['title']}: {expr}")
    assert not empty, "panels with no data from a live job:\n" + "\n".join(empty)
    titles = {p["title"] for p in model["panels"]}
    assert {"GPU utilization by node", "GPU temperature by node"} <= titles
    # The variables: `namespace` lists the namespaces of TrainingJobs (none under `stalwart run`);
    # `job` lists the jobs of the chosen namespace, every job under All.
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["namespace"]["allValue"] == ".*" and variables["namespace"]["includeAll"] is True
    jobs = (
        variables["job"]["query"]["query"] if isinstance(variables["job"]["query"], dict) else variables["job"]["query"]
    )
    selector = jobs.removeprefix("label_values(").removesuffix(", training_job)")
    listed = {r["metric"]["training_job"] for r in live.query(grafana_expr(selector))}
    assert JOB in listed
    assert not live.query(grafana_expr(selector, {**VARIABLES, "$namespace": "team-a"}))
    # Recent windows: a counter's increase over the last minutes, not its lifetime total.
    lifetime = live.value(f"sum(stalwart_worker_tokens_total{{{sel}}})")
    recent = live.value(f"sum(increase(stalwart_worker_tokens_total{{{sel}}}[5s]))")
    assert 0 <= recent < lifetime
