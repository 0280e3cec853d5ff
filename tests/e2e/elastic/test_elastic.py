"""Elastic data parallelism under `stalwart run`: a job of 3 nodes with minReplicas 2, no standby and
no spare machine (`--max-nodes 3`) loses a node, goes on at 2 nodes from its last checkpoint, grows
back to 3 at a checkpoint once a machine is restored (`--inject restore-machine`), and trains on
exactly the samples a clean run trains on, step by step (the global batch is kept)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import stalwart_run
from support.paths import REPO

from stalwart.agents.worker_sdk import trained_samples

# Two runs of a 3-node job (a clean one, and one that shrinks and grows): minutes on a starved machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

JOB = REPO / "tests" / "data" / "jobs" / "e2e.yaml"
STEPS = 100  # time for the restored machine's agent to join before the end, on a starved machine
STALWART = [sys.executable, "-m", "stalwart.cli.main"]


def elastic_job(folder: Path) -> Path:
    """The test job at 3 nodes, minReplicas 2, each rank's samples logged under folder/samples."""
    folder.mkdir()
    path = stalwart_run.job_variant(JOB, folder, args=["--sample-log", str(folder / "samples")], standbys=0)
    doc = yaml.safe_load(path.read_text())
    # Its own name: node agents' shadow-loader segments are named by job and node, and other tests
    # run e2e-tiny at the same time.
    doc["metadata"]["name"] = "e2e-elastic"
    role = doc["spec"]["roles"][0]
    role["replicas"], role["minReplicas"] = 3, 2
    role["command"][role["command"].index("--steps") + 1] = str(STEPS)
    path.write_text(yaml.safe_dump(doc))
    return path


def ranks_per_generation(samples: Path) -> dict[int, set[int]]:
    """Generation -> the ranks that trained a step in it (from the sample logs)."""
    out: dict[int, set[int]] = {}
    for log in samples.glob("rank-*.jsonl"):
        rank = int(log.stem.removeprefix("rank-"))
        for line in log.read_text().splitlines():
            try:
                out.setdefault(int(json.loads(line)["generation"]), set()).add(rank)
            except (ValueError, KeyError):
                continue  # a line cut short by the kill
    return out


def by_class(incidents: list[dict[str, Any]], failure_class: str) -> dict[str, Any]:
    found = [i for i in incidents if i["failure_class"] == failure_class]
    assert len(found) == 1, (failure_class, [(i["failure_class"], i["action"]) for i in incidents])
    return found[0]


def test_a_lost_node_with_no_machine_shrinks_the_job_which_grows_back_and_skips_no_sample(tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    code, result, output = stalwart_run.run_job(clean, STALWART, elastic_job(clean), timeout=400)
    assert code == 0 and result["phase"] == "Succeeded", output

    faulty = tmp_path / "faulty"
    code, result, output = stalwart_run.run_job(
        faulty,
        STALWART,
        elastic_job(faulty),
        "kill-node:node=1,step=15",
        "restore-machine:step=25,after=recovery",
        timeout=400,
        options=["--max-nodes", "3"],
    )
    assert code == 0 and result["phase"] == "Succeeded", output
    incidents = result["snapshot"]["incidents"]
    lost = by_class(incidents, "LostNode")
    assert lost["resize"]["from_replicas"] == 3 and lost["resize"]["to_replicas"] == 2, lost
    grow = by_class(incidents, "ElasticGrow")
    assert grow["resize"]["from_replicas"] == 2 and grow["resize"]["to_replicas"] == 3, grow
    assert grow["counted"] is False
    # The grow did not wait for the next periodic save: the workers were asked for one at once, or
    # (on a loaded machine) the standby was first ready in the very tick a periodic save committed.
    log = [json.loads(line) for line in (faulty / "run" / "controller.log").read_text().splitlines() if line]
    asked = any(e["msg"] == "capacity is back: the workers checkpoint early so that the job can grow" for e in log)
    [grew_at] = [e["ts"] for e in log if e["msg"] == "capacity is back: data parallelism grows at a checkpoint"]
    assert asked or any(e["msg"] == "checkpoint catalog" and e["ts"] == grew_at for e in log), log
    ranks = ranks_per_generation(faulty / "samples")
    assert [len(ranks[g]) for g in sorted(ranks)] == [6, 4, 6], ranks  # 3 nodes, then 2, then 3 again
    assert trained_samples(faulty / "samples") == trained_samples(clean / "samples")  # nothing skipped or repeated
    assert len(trained_samples(faulty / "samples")) == STEPS
