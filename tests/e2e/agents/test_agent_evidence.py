"""The agent as the platform's eyes: signatures found in streaming output, and /metrics."""

from __future__ import annotations

import json
import time
import urllib.request
import uuid
from pathlib import Path

from support.metrics_doc import documented
from support.paths import REPO

from stalwart.processes import spawn, stop_process, wait_for
from stalwart.signatures import default_database
from stalwart.store import Store, keys
from stalwart.store.records import AgentAction, AgentCommand, Assignment, Heartbeat, NodeAssignment, NodeRegistration

WORKERS = REPO / "tests" / "data" / "workers"


def start_agent(store: Store, tmp: Path, stalwart_cmd: list[str], procs: int, command: list[str], env: dict[str, str]):  # type: ignore[no-untyped-def]
    job = f"ev-{uuid.uuid4().hex[:6]}"
    doc = {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": job},
        "spec": {
            "roles": [
                {
                    "name": "trainer",
                    "replicas": 1,
                    "processesPerNode": procs,
                    "command": command,
                    "workingDir": str(WORKERS),
                    "env": env,
                }
            ],
            # The test workers import no torch: a fork server would import it for nothing.
            "faultTolerance": {"heartbeatIntervalSeconds": 0.5, "leaseTtlSeconds": 3, "warmWorkers": False},
        },
    }
    store.put(keys.job_spec(job), json.dumps(doc))
    log = open(tmp / "agent.log", "wb")
    proc = spawn(
        [
            *stalwart_cmd,
            "agent",
            "--job",
            job,
            "--node",
            "node-0",
            "--etcd",
            store.endpoint,
            "--workdir",
            str(tmp),
            "--job-dir",
            str(tmp),
        ],
        stdout=log,
    )
    log.close()
    assert wait_for(lambda: store.get_raw(keys.node_registration(job, "node-0")) is not None, 30)
    assignment = Assignment(
        job=job,
        generation=1,
        world_size=procs,
        master_addr="127.0.0.1",
        master_port=1,
        created_at=time.time(),
        nodes=[NodeAssignment(node="node-0", node_rank=0, role="trainer", first_rank=0, local_world_size=procs)],
    )
    store.put(keys.generation(job, 1), assignment)
    store.put(keys.node_command(job, "node-0"), AgentCommand(generation=1, action=AgentAction.RUN, issued_at=1.0))
    return job, proc


def test_every_signature_class_is_reported_through_the_agent(
    store: Store, tmp_path: Path, stalwart_cmd: list[str]
) -> None:
    db = default_database()
    cases = []  # (class, scope, line, exit code)
    for spec in db.classes:
        sample = spec.samples[0].line
        code = spec.exit_codes[0] if spec.exit_codes and not spec.exit_codes_need_evidence else 1
        cases.append((spec.name, spec.scope.value, sample, code))
    plan = {str(rank): [line, code] for rank, (_, _, line, code) in enumerate(cases)}
    job, agent = start_agent(
        store,
        tmp_path,
        stalwart_cmd,
        len(cases),
        ["python", "signature_worker.py"],
        {"SIGNATURE_PLAN": json.dumps(plan)},
    )
    try:

        def all_exited() -> bool:
            hb = store.get(keys.node_heartbeat(job, "node-0"), Heartbeat)
            return hb is not None and len(hb.workers) == len(cases) and all(w.exit_code is not None for w in hb.workers)

        assert wait_for(all_exited, 90), (tmp_path / "agent.log").read_text()[-2000:]
        hb = store.get(keys.node_heartbeat(job, "node-0"), Heartbeat)
        by_rank = {w.rank: w for w in hb.workers}  # type: ignore[union-attr]
        wrong = []
        for rank, (cls, scope, _line, _code) in enumerate(cases):
            w = by_rank[rank]
            streamed = {m.failure_class for m in w.matches}
            if cls not in streamed or w.failure_class != cls or w.blame_scope != scope:
                wrong.append((cls, scope, sorted(streamed), w.failure_class, w.blame_scope))
        assert not wrong, wrong
    finally:
        stop_process(agent, grace=10)


def test_the_agent_serves_metrics(store: Store, tmp_path: Path, stalwart_cmd: list[str]) -> None:
    job, agent = start_agent(store, tmp_path, stalwart_cmd, 2, ["python", "env_worker.py"], {"OUT_DIR": str(tmp_path)})
    try:
        reg = store.get(keys.node_registration(job, "node-0"), NodeRegistration)
        assert reg is not None and reg.metrics_port

        def scraped() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{reg.metrics_port}/metrics", timeout=5) as resp:
                return resp.read().decode()

        assert wait_for(lambda: 'rank="1"' in scraped() and "stalwart_worker_step" in scraped(), 60)
        text = scraped()
        agent_metrics = documented("Node agent")  # the job exporter's and the services' are theirs
        assert agent_metrics
        missing = [m for m in agent_metrics if m.removesuffix("_total") not in text]
        assert not missing, missing
        assert f'training_job="{job}"' in text and 'node="node-0"' in text
    finally:
        stop_process(agent, grace=10)


def test_heartbeats_carry_the_node_metric_vector(store: Store, tmp_path: Path, stalwart_cmd: list[str]) -> None:
    job, agent = start_agent(store, tmp_path, stalwart_cmd, 2, ["python", "env_worker.py"], {"OUT_DIR": str(tmp_path)})
    try:

        def with_vector() -> bool:
            hb = store.get(keys.node_heartbeat(job, "node-0"), Heartbeat)
            return hb is not None and hb.vector is not None and hb.vector.get("cpu_percent") is not None

        assert wait_for(with_vector, 60)
        hb = store.get(keys.node_heartbeat(job, "node-0"), Heartbeat)
        assert hb.vector["node"] == "node-0"  # type: ignore[index,union-attr]
        assert hb.machine_faults == []  # type: ignore[union-attr]  # a healthy machine reports none
    finally:
        stop_process(agent, grace=10)
