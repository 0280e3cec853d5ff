"""Pre-flight under `stalwart run` goes through the agents' checks, as on a cluster: each node's
agent runs its probes and one check rank per worker. One run (module fixture): a job of one node
with 4 workers and two standbys, whose probes read recorded outputs (STALWART_PROBE_RECORDINGS):
node-1's `nvidia-smi -q` shows one H100 where the spec expects 2, node-2's sysfs tree has its
required ib0 down, every other node reads a healthy tree. Both standbys are refused before they
join, naming the node and the reason; node-0's 4 workers were all checked; the job runs on node-0.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import REPO
from support.stalwart_run import job_variant, run_job

from stalwart.health.collective_records import RankReport
from stalwart.health.recorded import RECORDINGS_ENV

JOB = REPO / "tests" / "data" / "jobs" / "e2e-preflight.yaml"
DATA = REPO / "tests" / "data" / "health"
ONE_H100 = DATA / "nvidia-smi" / "h100-80gb-hbm3-driver-580.txt"  # one GPU, recorded on a lent machine
PORT_DOWN = DATA / "sysfs" / "ib-port-down"  # ib0's operstate down, its IB port DOWN
WORKERS = 4
STALWART = [sys.executable, "-m", "stalwart.cli.main"]
pytestmark = pytest.mark.timeout(900)

Run = tuple[int, dict[str, Any], str, Path]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("preflight-run")
    healthy = tmp / "sysfs-healthy"  # the recorded healthy tree, with an ib0 that is up (eth0's files)
    shutil.copytree(DATA / "sysfs" / "healthy", healthy)
    shutil.copytree(healthy / "class" / "net" / "eth0", healthy / "class" / "net" / "ib0")
    path = job_variant(JOB, tmp, args=["--steps", "6"], standbys=2)
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["name"] = "e2e-preflight-probes"  # its own shared-memory names beside other runs
    role = doc["spec"]["roles"][0]
    role.update(replicas=1, processesPerNode=WORKERS, health={"expectedGpus": 2, "requiredNics": ["ib0"]})
    path.write_text(yaml.safe_dump(doc))
    recordings = {
        "*": {"sysfsRoot": str(healthy)},
        "node-1": {"sysfsRoot": str(healthy), "nvidiaSmiQ": str(ONE_H100)},
        "node-2": {"sysfsRoot": str(PORT_DOWN)},
    }
    with pytest.MonkeyPatch.context() as env:  # `stalwart run` hands it to its agents
        env.setenv(RECORDINGS_ENV, json.dumps(recordings))
        code, result, output = run_job(tmp, STALWART, path, timeout=600)
    yield code, result, output, tmp / "run"


def refusals(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["node"]: i for i in result["snapshot"]["incidents"] if i["failure_class"] == "PreflightFailed"}


def test_standbys_with_a_gpu_missing_or_a_required_nic_down_are_refused_before_they_join(run: Run) -> None:
    code, result, output, _ = run
    snap = result["snapshot"]
    assert code == 0 and result["phase"] == "Succeeded", output
    refused = refusals(result)
    assert set(refused) == {"node-1", "node-2"}, snap["incidents"]
    assert "machine fault: gpu: 1 GPUs visible, 2 expected" in refused["node-1"]["evidence"], refused["node-1"]
    assert "machine fault: network: ib0 is down" in refused["node-2"]["evidence"], refused["node-2"]
    for incident in refused.values():
        assert incident["runbook"] == "preflight_failed" and not incident["counted"], incident
    # Their collectives passed: the probes alone refused them.
    assert not any("rank" in line for i in refused.values() for line in i["evidence"]), refused
    # The job ran on the healthy node, which never left; the refused ones never got a worker.
    assert snap["slots"] == ["node-0"] and snap["restarts"] == 0 and snap["step"] == 6, snap
    assert result["agents_by_generation"].keys() == {"1"} and set(result["agents_by_generation"]["1"]) == {"node-0"}
    assert {"node-1", "node-2"} <= set(snap["evicted"]), snap["evicted"]


def test_a_pre_flight_of_a_node_with_4_workers_checks_all_4(run: Run) -> None:
    code, result, output, run_dir = run
    assert code == 0, output
    shares = sorted((run_dir / "nodes" / "node-0" / "checks").iterdir())  # one per check it took part in
    assert shares, "node-0's agent ran no share of the checks"
    for share in shares:  # the pre-flight: node-0 hosts ranks 0-3, one per worker
        reports = [RankReport.loads(p.read_bytes()) for p in sorted(share.glob("rank-*.json"))]
        assert sorted(r.local_rank for r in reports) == list(range(WORKERS)), (share, reports)
        assert all(r.finished and r.compute_digest for r in reports), reports
