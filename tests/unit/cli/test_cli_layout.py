"""The layout on the on-call side: `stalwart status` shows each rank's coordinates, and `stalwart
diagnose` takes the layout from the job's spec in etcd (its --tp/--pp flags only override it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.ops.errors import OpsError
from stalwart.ops.stacks import engine_topology
from stalwart.store import Store, keys
from stalwart.store.records import (
    Assignment,
    Heartbeat,
    JobPhase,
    JobState,
    NodeAssignment,
    WorkerState,
    WorkerStatus,
)

JOB = "cli-layout"
SPEC = {
    "apiVersion": "stalwart.dev/v1alpha1",
    "kind": "TrainingJob",
    "metadata": {"name": JOB},
    "spec": {
        "roles": [
            {
                "name": "trainer",
                "replicas": 4,
                "processesPerNode": 2,
                "command": ["python"],
                "parallelism": {"tensor": 2, "pipeline": 2},
            }
        ]
    },
}


@pytest.fixture
def layout_job(store: Store) -> Iterator[Assignment]:
    now = time.time()
    slots = [f"node-{i}" for i in range(4)]
    store.put(keys.job_spec(JOB), json.dumps(SPEC))
    store.put(
        keys.job_state(JOB),
        JobState(job=JOB, phase=JobPhase.RUNNING, generation=1, slots=slots, created_at=now, updated_at=now),
    )
    assignment = Assignment(
        job=JOB,
        generation=1,
        world_size=8,
        master_addr="127.0.0.1",
        master_port=1,
        created_at=now,
        nodes=[
            NodeAssignment(node=n, node_rank=i, role="trainer", first_rank=2 * i, local_world_size=2)
            for i, n in enumerate(slots)
        ],
    )
    store.put(keys.generation(JOB, 1), assignment)
    for i, node in enumerate(slots):
        workers = [
            WorkerStatus(local_rank=j, rank=2 * i + j, pid=1, state=WorkerState.RUNNING, started_at=now, step=3)
            for j in range(2)
        ]
        store.put(keys.node_heartbeat(JOB, node), Heartbeat(node=node, generation=1, sent_at=now, workers=workers))
    yield assignment
    store.delete_prefix(keys.job_prefix(JOB))


def test_status_shows_each_ranks_coordinates(store: Store, layout_job: Assignment) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["status", JOB, "-o", "json", "--etcd", store.endpoint])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["layout"] == "trainer: tp 2 x pp 2 x dp 2"
    coords = {r["rank"]: r["coords"] for r in report["ranks"]}
    assert coords[5] == {"role": "trainer", "tp": 1, "cp": 0, "dp": 0, "pp": 1, "ep": 0}
    table = runner.invoke(app, ["status", JOB, "--etcd", store.endpoint], env={"COLUMNS": "160"}).stdout
    assert "layout" in table and "tp 2 x pp 2 x dp 2" in table and "tp1 pp1 dp0" in table


def test_diagnose_takes_the_layout_from_the_job_and_flags_override_it(store: Store, layout_job: Assignment) -> None:
    topology = engine_topology(store, JOB, layout_job, (None, None, None))
    assert (topology.tp, topology.pp, topology.dp) == (2, 2, 2) and topology.rank_nodes[5] == "node-2"
    override = engine_topology(store, JOB, layout_job, (None, 4, None))
    assert (override.tp, override.pp, override.dp) == (1, 4, 2)
    with pytest.raises(OpsError, match="does not divide"):
        engine_topology(store, JOB, layout_job, (3, None, None))
