"""Nodes as agent processes on this machine, each in its own session (its 'machine')."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
from pydantic import BaseModel, Field

from stalwart.cluster.agent_zygote import AgentZygote, ForkRequest
from stalwart.cluster.base import Cluster, NodeInfo, PreflightVerdict
from stalwart.logs import get_logger
from stalwart.net import free_port
from stalwart.processes import kill_session, signal_session, spawn, wait_for
from stalwart.store.client import Store
from stalwart.store.credentials import DIAGNOSIS_TOKEN_ENV

PREFLIGHT_FAULTS_ENV = "STALWART_PREFLIGHT_FAULTS"
NODE_FAULTS_ENV = "STALWART_NODE_FAULTS"  # {"node-1" or "*": {"VAR": "value"}}: injected faults
CAPACITY_FILE = "capacity.json"  # in the run folder: {"max_nodes": N, "lost": K}


class Capacity(BaseModel):
    """The machines a local run may use, as a cluster has a fixed number: `max_nodes` (standbys
    included) less the `lost` ones (a node killed as a machine takes its machine with it, as a dead
    host does, until one is restored). Kept in the run folder, so every controller of the run (a
    restarted one too) sees the same cluster."""

    max_nodes: int = Field(ge=1)
    lost: int = Field(default=0, ge=0)

    @property
    def machines(self) -> int:
        return max(0, self.max_nodes - self.lost)


class LocalCluster(Cluster):
    """Agents are started in new sessions so they outlive the controller that started them, as pods
    outlive an operator. Their pids are kept in the run folder, so a new controller finds them."""

    def __init__(self, job: str, etcd_endpoint: str, workdir: Path, job_dir: Path) -> None:
        self.job = job
        self.etcd_endpoint = etcd_endpoint
        self.workdir = workdir
        self.job_dir = job_dir
        self.zygote = AgentZygote(workdir / "agent-zygote.log", agent_env)
        self._pending: set[str] = set()  # nodes asked for while no machine was free (logged once)
        self._store: Store | None = None  # the pre-flight's, opened when first asked for
        self.log = get_logger("stalwart.cluster", job=job)

    def _node_dir(self, name: str) -> Path:
        return self.workdir / "nodes" / name

    def _pid_file(self, name: str) -> tuple[int, float | None] | None:
        """(the agent's pid, its start time) as start_node wrote them; files of older versions have no
        start time."""
        try:
            fields = (self._node_dir(name) / "agent.pid").read_text().split()
            return int(fields[0]), float(fields[1]) if len(fields) > 1 else None
        except (FileNotFoundError, ValueError, IndexError):
            return None

    def _pid(self, name: str) -> int | None:
        found = self._pid_file(name)
        return found[0] if found is not None else None

    def _alive(self, pid: int, name: str) -> bool:
        """The agent we started is running: its pid, started when we started it (a reused pid is some
        other process). Without a start time: its node's name on the command line. An empty command
        line is an agent still inside execve: Popen returns once the exec closes its pipe, before the
        kernel sets the new arguments, and on a loaded host a look right after start_node sees that
        window. (A forked agent has its zygote's command line: its start time tells it.)"""
        found = self._pid_file(name)
        started = found[1] if found is not None and found[0] == pid else None
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            if started is not None:
                return proc.create_time() == started
            cmdline = proc.cmdline()
            return not cmdline or name in cmdline
        except psutil.Error:
            return False

    # -- capacity (stalwart run --max-nodes) -------------------------------------------------------
    def capacity(self) -> Capacity | None:
        """The run's machine limit, or None: as many machines as the job asks for."""
        try:
            return Capacity.model_validate_json((self.workdir / CAPACITY_FILE).read_text())
        except FileNotFoundError:
            return None

    def limit_machines(self, max_nodes: int) -> None:
        """Cap the machines this run may use (standbys included)."""
        self._write_capacity(Capacity(max_nodes=max_nodes))

    def restore_machine(self) -> Capacity | None:
        """A lost machine comes back (repaired, or a new one joined the pool): one more node fits."""
        capacity = self.capacity()
        if capacity is not None and capacity.lost:
            capacity = capacity.model_copy(update={"lost": capacity.lost - 1})
            self._write_capacity(capacity)
        return capacity

    def free_machines(self) -> int | None:
        """Under a machine limit: the machines not lost and not held by a live node (a dead node's
        machine is free once it is stopped; a killed one's was lost with it)."""
        capacity = self.capacity()
        if capacity is None:
            return None
        return max(0, capacity.machines - sum(1 for n in self.list_nodes() if n.alive))

    def _write_capacity(self, capacity: Capacity) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        tmp = self.workdir / f"{CAPACITY_FILE}.tmp"
        tmp.write_text(capacity.model_dump_json())
        tmp.replace(self.workdir / CAPACITY_FILE)

    def _occupied(self) -> list[str]:
        """Nodes holding a machine: started and not stopped (a dead one holds it until stopped)."""
        nodes_dir = self.workdir / "nodes"
        return [p.parent.name for p in nodes_dir.glob("*/agent.pid")] if nodes_dir.exists() else []

    def start_node(self, name: str, role: str | None = None) -> None:
        """Start the node's agent, or, when every machine is taken, leave it unstarted, as a pod stays
        Pending: the controller asks again while it waits, and the node starts once a machine is free."""
        capacity = self.capacity()
        if capacity is not None and len([n for n in self._occupied() if n != name]) >= capacity.machines:
            if name not in self._pending:
                self._pending.add(name)
                self.log.warning(
                    "no machine free for a node: it waits",
                    fields={"node": name, "max_nodes": capacity.max_nodes, "lost": capacity.lost},
                )
            return
        self._pending.discard(name)
        node_dir = self._node_dir(name)
        node_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "stalwart.cli.main",
            "agent",
            "--job",
            self.job,
            "--node",
            name,
            "--etcd",
            self.etcd_endpoint,
            "--workdir",
            str(self.workdir),
            "--job-dir",
            str(self.job_dir),
        ]
        faults: dict[str, dict[str, str]] = json.loads(os.environ.get(NODE_FAULTS_ENV, "{}"))
        env = agent_env()
        env.update(faults.get("*", {}))  # "*": every node, standbys included
        env.update(faults.get(name, {}))
        # Pre-flight faults (tests, demos): {"node-1": {"STALWART_FAULT_CORRUPT_COMPUTE": "1"}}, for
        # the check ranks the agent starts (they inherit its environment).
        env.update(json.loads(os.environ.get(PREFLIGHT_FAULTS_ENV, "{}")).get(name, {}))
        log_path = node_dir / "agent.log"
        pid = self.zygote.start_agent(ForkRequest(args=argv[3:], env=env, log=str(log_path)))
        if pid is None:
            with open(log_path, "ab") as log:
                proc = spawn(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT, die_with_parent=False, new_session=True
                )
            pid = proc.pid
            # We will not wait() for it from here (it outlives us); a reaper thread avoids a zombie.
            _reap_in_background(proc)
        try:
            started = f" {psutil.Process(pid).create_time()!r}"
        except psutil.Error:
            started = ""  # gone already: no start time to check later
        (node_dir / "agent.pid").write_text(f"{pid}{started}")

    def stop_node(self, name: str, grace: float = 10.0) -> None:
        pid = self._pid(name)
        if pid is None:
            return
        if self._alive(pid, name):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            wait_for(lambda: not self._alive(pid, name), grace)
        kill_session(pid)  # the agent led its session: whatever is left of the 'machine' goes
        (self._node_dir(name) / "agent.pid").unlink(missing_ok=True)

    def kill_node(self, name: str) -> list[int]:
        """Fault injection: the machine dies at once, agent and workers alike (SIGKILL). Under a
        machine limit the machine is lost with it, until restore_machine."""
        pid = self._pid(name)
        capacity = self.capacity()
        if capacity is not None and pid is not None:  # before the kill: a controller that sees the node
            # gone at once must not find its machine free for the replacement
            self._write_capacity(capacity.model_copy(update={"lost": capacity.lost + 1}))
        return kill_session(pid) if pid is not None else []

    def freeze_node(self, name: str) -> list[int]:
        """Fault injection: the machine goes silent (SIGSTOP to everything on it); stop_node ends it."""
        pid = self._pid(name)
        return signal_session(pid, signal.SIGSTOP) if pid is not None else []

    def list_nodes(self) -> list[NodeInfo]:
        out = []
        nodes_dir = self.workdir / "nodes"
        for pid_file in sorted(nodes_dir.glob("*/agent.pid")) if nodes_dir.exists() else []:
            name = pid_file.parent.name
            pid = self._pid(name)
            out.append(NodeInfo(name=name, pid=pid, alive=pid is not None and self._alive(pid, name)))
        return out

    def rendezvous(self, node: str) -> tuple[str, int]:
        return "127.0.0.1", free_port()

    def preflight(self, nodes: list[str], procs_per_node: int) -> list[PreflightVerdict]:
        """The checks as on a cluster (stalwart.cluster.agent_checks): each node's agent runs its
        probes and its `procs_per_node` check ranks (gloo on loopback), so a node whose probes find
        a machine fault (a GPU missing, a required NIC down) is refused before it gets ranks."""
        from stalwart.cluster.agent_checks import checks_through_agents

        if self._store is None:
            self._store = Store(self.etcd_endpoint)
        return checks_through_agents(self._store, self.job, nodes, procs_per_node, self.log, backend="gloo")

    def stop_all(self) -> None:
        for info in self.list_nodes():
            self.stop_node(info.name)

    def close(self) -> None:
        """Ends the agent zygote; the agents it forked live on."""
        self.zygote.close()
        if self._store is not None:
            self._store.close()


def agent_env() -> dict[str, str]:
    """As a pod does not get the operator's environment, an agent (and so its workers) does not get
    the control plane's credentials: the diagnosis service's token stays with the controller. The
    agent zygote gets the same (a forked agent's /proc environ is the zygote's)."""
    return {k: v for k, v in os.environ.items() if k != DIAGNOSIS_TOKEN_ENV}


def _reap_in_background(proc: subprocess.Popen[bytes]) -> None:
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
