"""The node agent as a real process against a real etcd, with real worker processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.paths import REPO

from stalwart.processes import spawn, stop_process, wait_for
from stalwart.store import Store, keys
from stalwart.store.records import AgentAction, AgentCommand, Assignment, Heartbeat, NodeAssignment

WORKERS = REPO / "tests" / "data" / "workers"


def job_doc(name: str, env: dict[str, str], warm: bool) -> dict:  # type: ignore[type-arg]
    """The test worker imports no torch: a fork server (warmWorkers, the default) would import it for
    nothing, so only the tests of the default path's environment and of a killed agent keep it."""
    return {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "roles": [
                {
                    "name": "trainer",
                    "replicas": 1,
                    "processesPerNode": 2,
                    "command": ["python", "env_worker.py"],
                    "workingDir": str(WORKERS),
                    "env": env,
                }
            ],
            "faultTolerance": {
                "heartbeatIntervalSeconds": 0.5,
                "leaseTtlSeconds": 2,
                "stopGraceSeconds": 2,
                "warmWorkers": warm,
            },
        },
    }


class AgentUnderTest:
    def __init__(
        self, store: Store, tmp: Path, stalwart_cmd: list[str], env: dict[str, str] | None = None, warm: bool = False
    ) -> None:
        self.store = store
        self.job = f"agent-{uuid.uuid4().hex[:6]}"
        self.node = "node-0"
        self.out = tmp / "out"
        self.out.mkdir()
        store.put(
            keys.job_spec(self.job), json.dumps(job_doc(self.job, {"OUT_DIR": str(self.out), **(env or {})}, warm))
        )
        argv = [
            *stalwart_cmd,
            "agent",
            "--job",
            self.job,
            "--node",
            self.node,
            "--etcd",
            store.endpoint,
            "--workdir",
            str(tmp),
            "--job-dir",
            str(tmp),
        ]
        self.log = open(tmp / "agent.log", "wb")
        self.proc = spawn(argv, stdout=self.log)
        assert wait_for(lambda: store.get_raw(keys.node_registration(self.job, self.node)) is not None, 30), (
            tmp / "agent.log"
        ).read_text()

    def command(self, generation: int, action: AgentAction = AgentAction.RUN) -> None:
        assignment = Assignment(
            job=self.job,
            generation=generation,
            world_size=2,
            master_addr="127.0.0.1",
            master_port=29999,
            created_at=time.time(),
            nodes=[NodeAssignment(node=self.node, node_rank=0, role="trainer", first_rank=0, local_world_size=2)],
        )
        self.store.put(keys.generation(self.job, generation), assignment)
        self.store.put(
            keys.node_command(self.job, self.node),
            AgentCommand(generation=generation, action=action, issued_at=time.time()),
        )

    def heartbeat(self) -> Heartbeat | None:
        return self.store.get(keys.node_heartbeat(self.job, self.node), Heartbeat)

    def worker_env(self, rank: int, generation: int) -> dict[str, str]:
        return json.loads((self.out / f"rank-{rank}-gen-{generation}.json").read_text())

    def stop(self) -> None:
        stop_process(self.proc, grace=10)
        self.log.close()


@pytest.fixture
def make_agent(store: Store, tmp_path: Path, stalwart_cmd: list[str]) -> Iterator:  # type: ignore[type-arg]
    agents: list[AgentUnderTest] = []

    def make(env: dict[str, str] | None = None, warm: bool = False) -> AgentUnderTest:
        agents.append(AgentUnderTest(store, tmp_path, stalwart_cmd, env, warm))
        return agents[-1]

    yield make
    for a in agents:
        a.stop()


def test_workers_get_the_torchrun_environment_and_report_progress(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent(warm=True)
    agent.command(1)
    assert wait_for(lambda: len(list(agent.out.glob("*.json"))) == 2, 60)
    env = agent.worker_env(1, 1)
    assert env["RANK"] == "1" and env["LOCAL_RANK"] == "1" and env["GROUP_RANK"] == "0"
    assert env["WORLD_SIZE"] == "2" and env["LOCAL_WORLD_SIZE"] == "2"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29999")
    assert env["OMP_NUM_THREADS"] == "1"

    def stepped() -> bool:
        hb = agent.heartbeat()
        return hb is not None and len(hb.workers) == 2 and all(w.step == 7 for w in hb.workers)

    assert wait_for(stepped, 30)
    hb = agent.heartbeat()
    assert hb.generation == 1  # type: ignore[union-attr]
    assert {w.rank for w in hb.workers} == {0, 1}  # type: ignore[union-attr]
    assert all(w.loss == 1.5 and w.tokens_per_second == 200 for w in hb.workers)  # type: ignore[union-attr]


def test_a_new_generation_replaces_the_workers(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent()
    agent.command(1)
    assert wait_for(lambda: len(list(agent.out.glob("*gen-1.json"))) == 2, 60)
    old = [agent.worker_env(r, 1)["pid"] for r in (0, 1)]
    agent.command(2)
    assert wait_for(lambda: len(list(agent.out.glob("*gen-2.json"))) == 2, 60)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in old)
    assert wait_for(lambda: (hb := agent.heartbeat()) is not None and hb.generation == 2, 10)


def test_an_exit_is_reported_with_its_code_and_log_tail(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent({"EXIT_CODE": "3", "EXIT_RANK": "1"})
    agent.command(1)

    def exited() -> bool:
        hb = agent.heartbeat()
        return hb is not None and any(w.exit_code == 3 for w in hb.workers)

    assert wait_for(exited, 60)
    worker = next(w for w in agent.heartbeat().workers if w.exit_code == 3)  # type: ignore[union-attr]
    assert worker.rank == 1 and worker.exited_at is not None
    assert "rank 1 says goodbye" in worker.log_tail


def test_sigterm_stops_workers_and_releases_the_lease_at_once(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent()
    agent.command(1)
    assert wait_for(lambda: len(list(agent.out.glob("*.json"))) == 2, 60)
    pids = [agent.worker_env(r, 1)["pid"] for r in (0, 1)]
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=30) == 0
    assert not any(psutil.pid_exists(p) for p in pids)
    assert agent.store.get_raw(keys.node_registration(agent.job, agent.node)) is None


def test_workers_die_with_a_killed_agent(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent(warm=True)
    agent.command(1)
    assert wait_for(lambda: len(list(agent.out.glob("*.json"))) == 2, 60)
    pids = [agent.worker_env(r, 1)["pid"] for r in (0, 1)]
    os.kill(agent.proc.pid, signal.SIGKILL)
    agent.proc.wait(timeout=10)
    assert wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), 10)
    # Its lease lapses on its own: that is how the controller learns the node is lost.
    assert wait_for(lambda: agent.store.get_raw(keys.node_registration(agent.job, agent.node)) is None, 15)


def test_shutdown_command_ends_the_agent(make_agent) -> None:  # type: ignore[no-untyped-def]
    agent = make_agent()
    agent.command(1)
    assert wait_for(lambda: len(list(agent.out.glob("*.json"))) == 2, 60)
    agent.command(1, AgentAction.SHUTDOWN)
    assert agent.proc.wait(timeout=30) == 0


def test_agent_never_imports_torch() -> None:
    """A node agent renews its lease from a thread: importing torch (seconds, holding the GIL while
    its libraries load) would starve it, and a standby would pay it when it is promoted."""
    code = (
        "import sys, stalwart.agents.agent, stalwart.agents.data_plane, stalwart.checkpoint.peers, "
        "stalwart.signatures\n"
        "from stalwart.dataloader import SHM_ENV\n"
        "from stalwart.agents.standby import prewarm_imports\n"
        "prewarm_imports()\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_a_report_from_the_previous_generation_is_not_the_new_ones_progress(tmp_path: Path) -> None:
    """The old workers' last reports can still sit in the agent's socket when the new generation's
    workers start (same ranks): counted, they would mark the recovery done before it is."""
    from stalwart.agents.workers import WorkerGroup
    from stalwart.store.records import ProgressReport

    node = NodeAssignment(node="node-0", node_rank=0, role="trainer", first_rank=0, local_world_size=1)
    assignment = Assignment(
        job="j",
        generation=2,
        world_size=1,
        master_addr="127.0.0.1",
        master_port=1,
        nodes=[node],
        created_at=time.time(),
    )
    group = WorkerGroup(
        assignment,
        node,
        [sys.executable, "-c", "import time; time.sleep(60)"],
        [dict(os.environ)],
        tmp_path,
        tmp_path / "logs",
    )
    try:
        group.record(ProgressReport(rank=0, local_rank=0, step=62, generation=1, sent_at=time.time()))
        assert group.statuses()[0].step is None and group.statuses()[0].first_step is None
        group.record(ProgressReport(rank=0, local_rank=0, step=61, generation=2, sent_at=time.time()))
        assert group.statuses()[0].first_step == 61
        group.record(ProgressReport(rank=0, local_rank=0, step=62))  # a worker outside Stalwart's launch
        assert group.statuses()[0].step == 62
    finally:
        group.stop(grace=1)
