"""The node agent: the only thing that touches workers. A supervisor with named states
(stalwart.agents.agent_state) over parts that each do one job:

- the lease keeper (lease_keeper): holds the node's lease (a keep-alive every heartbeat interval) and
  writes the heartbeat record when it changed, or its progress at most every progress interval;
- the worker launcher (launcher): a generation's workers, from the pure `worker_env()`;
- on-demand reports (reports): the workers' stacks (with the node's metric window) and logs;
- the check duty (check_duty): its share of the collective and compute checks, when asked;
- the standby duty (standby): the newest checkpoint mirrored, the data loader's position known;
- the data plane (data_plane): the shadow data loader and the host-memory checkpoint store;
- the probes (probe_loop) and the Prometheus exporter (metrics).

Every state change happens on one thread (the loop in `run`); etcd watch callbacks only enqueue,
and the other parts' threads only read what the loop publishes.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import threading
import time
from pathlib import Path

from stalwart import worker_contract as contract
from stalwart.agents.agent_state import AgentState, check_transition
from stalwart.agents.check_duty import CheckDuty
from stalwart.agents.checkpoint_requests import CheckpointRequests
from stalwart.agents.checkpoint_token import CheckpointToken
from stalwart.agents.data_plane import DataPlane, DataPlaneError, memory_peer, memory_uri
from stalwart.agents.launcher import NodeServices, WorkerLauncher, generation_spec
from stalwart.agents.lease_keeper import LeaseKeeper
from stalwart.agents.metrics import MetricsExporter
from stalwart.agents.metrics_history import MetricsHistory
from stalwart.agents.probe_loop import ProbeLoop
from stalwart.agents.progress_inbox import ProgressInbox
from stalwart.agents.reports import OnDemandReports
from stalwart.agents.saved_checkpoints import SavedCheckpoints, without_secrets
from stalwart.agents.standby import StandbyDuty
from stalwart.agents.warm_pool import READY_WAIT_SECONDS, WarmPool, warm_imports, warm_size
from stalwart.agents.workers import WorkerGroup
from stalwart.health.collective_runner import WORKER_MODULE, start_cold
from stalwart.health.node_expectations import node_expectations
from stalwart.health.node_vector import node_metric_vector
from stalwart.logs import get_logger
from stalwart.processes import ChildProcess
from stalwart.spec import ConfinementError, PathConfinement, TrainingJob
from stalwart.spec.topology import Topology
from stalwart.store import keys
from stalwart.store.client import Store, StoreUnavailable
from stalwart.store.credentials import agent_job_token
from stalwart.store.heartbeat_budget import job_progress_interval
from stalwart.store.jobs import read_spec
from stalwart.store.records import (
    AgentAction,
    AgentCommand,
    Assignment,
    Heartbeat,
    JobState,
    NodeAssignment,
    NodeRegistration,
    SavedCheckpoint,
    WorkerStatus,
)
from stalwart.worker_contract import CHECKPOINT_TOKEN

# The loop's pace. A command, a stack or log request and a check request wake it at once (a restart
# waits for no tick); the rest waits for the next tick: a worker's exit and its reports (a crash is
# seen within LOOP_INTERVAL: the first step of a recovery), log signatures, the fork server's spares.
# Without workers there is nothing else to watch.
LOOP_INTERVAL = 0.05  # while workers run
IDLE_LOOP_INTERVAL = 0.25  # without workers (a standby, a node between generations)
METRICS_PORT_ENV = "STALWART_METRICS_PORT"  # 0 or unset: any free port (it is in the registration)


class AgentExit(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class NodeAgent:
    def __init__(self, store: Store, job: str, node: str, workdir: Path, job_dir: Path) -> None:
        self.store = store
        self.job_name = job
        self.node = node
        self.workdir = workdir
        self.job_dir = job_dir
        self.paths = PathConfinement.from_env(job_dir)  # where the spec may point us (docs/security.md)
        self.log = get_logger("stalwart.agent", job=job, node=node)
        spec = read_spec(store, job)
        if spec is None:
            raise AgentExit(2, f"job {job!r} has no spec in etcd at {keys.job_spec(job)}")
        self.job: TrainingJob = spec
        self.ft = self.job.spec.fault_tolerance
        self.state = AgentState.IDLE
        self.generation = 0
        self.group: WorkerGroup | None = None
        self._last_group: WorkerGroup | None = None  # for log requests between generations
        self._stop_signal: int | None = None
        self.commands: queue.Queue[AgentCommand] = queue.Queue()
        self._wake = threading.Event()  # set by the command watch: the loop acts on it at once
        self._listed_standby = False
        # The heartbeat thread reads the workers' snapshot the loop publishes (a list, replaced whole).
        self._beat_workers: list[WorkerStatus] = []
        self.saves = SavedCheckpoints()  # committed saves the ranks reported, for the job's catalog
        self._beat_saves: list[SavedCheckpoint] = []
        self.address = os.environ.get(contract.NODE_ADDRESS, "127.0.0.1")
        self.node_dir = workdir / "nodes" / node
        self.inbox = ProgressInbox()
        self.metrics = MetricsExporter(job, node)
        self.history = MetricsHistory()
        self.probes = ProbeLoop(self.metrics, node_expectations(self.job.spec))
        self._hand_down_job_token()
        self.checkpoint_token = CheckpointToken(store, job)
        self.warm = WarmPool(
            warm_size(self.job.spec.roles),
            enabled=self.ft.warm_workers,
            log=self.node_dir / "fork-server.log",
            imports=warm_imports(self.job.spec.roles),
        )
        self.data_plane = DataPlane(
            self.job,
            job_dir,
            node,
            self.address,
            self.node_dir,
            self.log,
            self.checkpoint_token.get,
            fork_loader=self._fork_helper,
        )
        self.launcher = WorkerLauncher(self.job, self.paths, self.node_dir, self.warm)
        self.lease_keeper = LeaseKeeper(
            store,
            job,
            node,
            self.ft.lease_ttl_seconds,
            self.ft.heartbeat_interval_seconds,
            self._heartbeat,
            self.log,
            outage_limit=self.ft.etcd_outage_seconds,
            progress_interval=job_progress_interval(self.job.spec),
        )
        self._retry: AgentCommand | None = None  # a command etcd's absence interrupted, carried out when it is back
        self.reports = OnDemandReports(
            store,
            job,
            node,
            self.log,
            self._workers_now,
            lambda: self.history.as_records(self.generation),
            wake=self._wake.set,
        )
        self.checkpoint_requests = CheckpointRequests(store, job, self.node_dir, self.log, wake=self._wake.set)
        self.checks = CheckDuty(
            store,
            job,
            node,
            self.address,
            self.node_dir,
            self.log,
            self._start_check_rank,
            wake=self._wake.set,
            machine_check=self.probes.check_now,
            bandwidth_floor_gbps=lambda: self.probes.expected.min_bus_bandwidth_gbps,
        )
        self.standby = StandbyDuty(
            store, self.job, node, self.log, lambda: self._listed_standby, self.checkpoint_token.get
        )

    # -- helpers forked from the fork server (torch imported) when it can ----------------------------
    def _fork_helper(self, module: str, args: list[str], log: Path) -> ChildProcess | None:
        return self.warm.launch_module(module, args, {**os.environ, "PYTHONUNBUFFERED": "1"}, log)

    def _start_check_rank(self, env: dict[str, str], log: Path) -> ChildProcess:
        # A server still importing torch is worth waiting for: a cold rank would import it too, and
        # every rank of this node would (an operator pod's agent starts its server cold).
        return self.warm.launch_module(WORKER_MODULE, [], env, log, ready_wait=READY_WAIT_SECONDS) or start_cold(
            env, log
        )

    # -- named states --------------------------------------------------------------------------
    def _enter(self, new: AgentState, why: str) -> None:
        if new is self.state:
            return
        check_transition(self.state, new)
        self.log.info("agent state", fields={"from": self.state.value, "to": new.value, "why": why})
        self.state = new
        self.lease_keeper.beat_now()

    # -- lifecycle ---------------------------------------------------------------------------
    def _hand_down_job_token(self) -> None:
        """The job's credential, for the memory store, the warm workers and the workers this agent
        starts (they inherit it), and for its own memory-store client: set before any of them."""
        token = agent_job_token(self.store, self.job_name)
        if token:
            os.environ[CHECKPOINT_TOKEN] = token
        else:
            # The checkpoint token then makes the memory stores' own token in etcd.
            self.log.warning("the job has no token in etcd: the memory stores use a checkpoint token of their own")

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum

    def register(self) -> None:
        try:
            self.data_plane.start()
        except DataPlaneError as exc:
            raise AgentExit(2, str(exc)) from None
        metrics_port = self.metrics.start(
            port=int(os.environ.get(METRICS_PORT_ENV, "0")),
            host=os.environ.get("STALWART_METRICS_HOST") or self.address,
        )
        registered_at = time.time()
        lease = self.lease_keeper.join(
            lambda lease_id: NodeRegistration(
                node=self.node,
                job=self.job_name,
                host=socket.gethostname(),
                agent_pid=os.getpid(),
                registered_at=registered_at,
                lease_id=lease_id,
                metrics_port=metrics_port,
                address=self.address,
                memory_port=self.data_plane.memory_port,
            )
        )
        self.store.watch_prefix(keys.node_command(self.job_name, self.node), self._on_command)
        self.reports.watch()
        self.checks.watch()
        self.checkpoint_requests.watch()
        self.log.info("registered", fields={"lease": f"{lease.id:x}"})
        self.lease_keeper.start()
        memory = self.data_plane.memory_port
        self.standby.start(f"{self.address}:{memory}" if memory is not None else None)
        self.probes.start()
        # A command written before our watch started is not replayed by it: read once.
        current = self.store.get(keys.node_command(self.job_name, self.node), AgentCommand)
        if current is not None:
            self.commands.put(current)
        # Whether this node is a standby: read once, not watched. The controller lists a standby
        # before it starts the node and never lists a slot node as one later; a standby leaves the
        # pool by a RUN command (promoted) or is stopped (dropped). The state holds every slot and is
        # rewritten every few seconds: a watch on it from every agent would be O(nodes^2) traffic.
        state = self.store.get(keys.job_state(self.job_name), JobState)
        if state is not None:
            self._follow_job_state(state)

    def _on_command(self, _key: str, value: bytes | None) -> None:
        if value is not None:
            self.commands.put(AgentCommand.loads(value))
            self._wake.set()

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self.register()
            while self._stop_signal is None:
                fenced = self.lease_keeper.fenced
                if fenced is not None:
                    self._enter(AgentState.FENCED, str(fenced))
                    raise AgentExit(fenced.code, str(fenced))
                self._wake.clear()  # before the tick: a command that comes during it wakes the next at once
                dirty = self._tick()
                if dirty:
                    self.lease_keeper.beat_now()
                self._wake.wait(LOOP_INTERVAL if self.group is not None and self.group.running else IDLE_LOOP_INTERVAL)
            self.log.info("stopping on signal", fields={"signal": self._stop_signal})
            return 0
        except AgentExit as exc:
            self.log.warning("agent exiting", fields={"reason": str(exc), "code": exc.code})
            return exc.code
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self.lease_keeper.stop(revoke=False)
        self.standby.stop()
        self._stop_workers(transition=False)
        self.warm.close()
        self.data_plane.close()
        self.inbox.close()
        self.probes.stop()
        self.metrics.stop()
        # Revoked last: the controller sees the node go at once (not after the TTL), once it is gone.
        self.lease_keeper.stop(revoke=True)
        self.store.close()

    # -- the loop ------------------------------------------------------------------------------
    def _tick(self) -> bool:
        """One pass over the job state, commands, requests and workers; True if a heartbeat should go out now."""
        dirty = False
        self.warm.maintain()
        dirty |= self._apply_commands()
        self.reports.serve()
        self.checks.serve()
        self.checkpoint_requests.serve()
        if self.group is not None:
            # Exits first, then the reports: whatever a worker sent before it exited (its last step,
            # its final checkpoint) is then in the same heartbeat as its exit.
            exited, exit_matches = self.group.poll()
            for report in self.inbox.drain():
                self.group.record(report)
                self.saves.record(report)
                self.metrics.record_report(report)
            matches = self.group.scan() + exit_matches
            for match in matches:
                self.metrics.record_signature_match(match)
                self.log.warning(
                    "log signature",
                    fields={
                        "rank": match.rank,
                        "class": match.failure_class,
                        "scope": match.scope.value,
                        "line": match.line[:200],
                    },
                )
            dirty |= exited or bool(matches)
        self._beat_workers = self.group.statuses() if self.group else []
        self._beat_saves = self.saves.newest()
        return dirty

    def _apply_commands(self) -> bool:
        """The commands received since the last pass, in order. One that etcd's absence cut short
        (it reads the generation's assignment) is carried out again once etcd answers."""
        dirty = False
        if self._retry is not None and self.lease_keeper.etcd_away:
            return False
        while True:
            cmd, self._retry = self._retry, None
            if cmd is None:
                try:
                    cmd = self.commands.get_nowait()
                except queue.Empty:
                    return dirty
            try:
                dirty |= self._apply(cmd)
            except StoreUnavailable as exc:
                self._retry = cmd
                self.log.warning("command waits for etcd", fields={"generation": cmd.generation, "error": str(exc)})
                return dirty

    def _follow_job_state(self, state: JobState) -> None:
        """Standby or idle, as the job's state lists this node (running states are the commands')."""
        self._set_standby(self.node in state.standbys)
        if self._listed_standby and self.state is AgentState.IDLE:
            self._enter(AgentState.STANDBY, "the job lists this node as a standby")

    def _set_standby(self, listed: bool) -> None:
        if listed != self._listed_standby:
            self._listed_standby = listed
            self.standby.listing_changed()

    def _apply(self, cmd: AgentCommand) -> bool:
        self.log.debug(
            "command",
            fields={
                "action": cmd.action.value,
                "generation": cmd.generation,
                "lag": round(time.time() - cmd.issued_at, 3),
            },
        )
        if cmd.action is AgentAction.SHUTDOWN:
            raise AgentExit(0, f"job finished (generation {cmd.generation})")
        if cmd.generation < self.generation:
            return False
        if cmd.action is AgentAction.STOP:
            if self.group is not None:
                self.log.info("stopping workers", fields={"generation": cmd.generation})
                self._stop_workers()
                self.generation = cmd.generation
                self._enter(AgentState.IDLE, f"stopped for generation {cmd.generation}")
                return True
            return False
        if cmd.generation == self.generation and self.group is not None:
            return False  # already running this generation (a replayed command)
        assignment = self.store.get(keys.generation(self.job_name, cmd.generation), Assignment)
        mine = assignment.for_node(self.node) if assignment else None
        if assignment is None or mine is None:
            self.log.warning("command for a generation without my assignment", fields={"generation": cmd.generation})
            return False
        first_run = self.generation == 0
        self._stop_workers()
        self.generation = cmd.generation
        if assignment.code_version != self.job.spec.code_version:
            self._reload_spec()  # a lazy hot update: the new code starts with this generation
        topology = Topology.from_spec(generation_spec(self.job.spec, assignment), assignment.rank_nodes())
        self.probes.expect(node_expectations(self.job.spec, mine.role))  # its role's health settings now
        replay = assignment.replay_steps is not None
        if first_run and not replay:
            self._prewarm_loader(assignment, mine, topology)
        peer = None if replay else memory_peer(self.node, topology)  # at 10,000 nodes: 0.4 s, so once
        memory = None if replay else self._memory_uri(assignment, peer)
        try:
            checkpoint_uri = self._checkpoint_uri()
        except ConfinementError as exc:
            raise AgentExit(2, f"refusing the job's spec: {exc}") from None
        self.saves.default_location = without_secrets(checkpoint_uri)
        services = NodeServices(
            node=self.node,
            progress_socket=self.inbox.path,
            checkpoint_uri=checkpoint_uri,
            memory_uri=memory,
            checkpoint_token=self.checkpoint_token.get() if memory else None,
            checkpoint_request=str(self.checkpoint_requests.path),
            shadow_segment=self.data_plane.shadow_segment,
            data_config=self.data_plane.data_config_json,
            etcd=self.store.endpoint,
            address=self.address,
            dataplane_token=self.checkpoint_token.get() if self.job.spec.data_plane is not None else "",
        )
        peer = peer if services.memory_uri else None
        try:
            self.group = self.launcher.launch(assignment, mine, services)
        except ConfinementError as exc:
            raise AgentExit(2, f"refusing the job's spec: {exc}") from None
        self._set_standby(False)  # promoted: its duty as a standby ends with its first generation
        self._enter(AgentState.RUNNING, f"generation {cmd.generation}")
        self.log.info(
            "workers started",
            fields={
                "generation": cmd.generation,
                "ranks": [w.rank for w in self.group.workers],
                "pids": [w.proc.pid for w in self.group.workers],
                "warm": self.group.warm_starts,
                "memory_peer": peer,
                "lag": round(time.time() - cmd.issued_at, 3),  # since the controller issued the command
            },
        )
        return True

    def _prewarm_loader(self, assignment: Assignment, mine: NodeAssignment, topology: Topology) -> None:
        """A promoted standby's shadow loader starts on the batches its ranks will ask for first,
        from the checkpoint they will load, while the workers are still starting."""
        known = self.standby.loader_state(assignment.resume_max_step)
        if known is None:
            return
        step, data_state = known
        try:
            ranks = self.data_plane.prewarm_loader(topology, mine, data_state)
        except Exception as exc:  # a pre-warm is an optimization: the workers ask for what they need
            self.log.warning("shadow loader pre-warm failed", fields={"step": step, "error": str(exc)})
            return
        if ranks is not None:
            self.log.info("shadow loader pre-warmed", fields={"step": step, "dp_ranks": ranks})

    def _memory_uri(self, assignment: Assignment, peer: str | None) -> str | None:
        """From the assignment, which names every node's memory store (no read of the nodes prefix:
        at 10,000 nodes that was tens of MB per agent per generation)."""
        stores = assignment.memory_stores()
        return memory_uri(self.node, self.job_name, assignment, peer, stores, spill_dir=self.node_dir)

    def _reload_spec(self) -> None:
        spec = read_spec(self.store, self.job_name)
        if spec is not None:
            self.job = spec
            self.launcher.job = self.job
            self.log.info("job spec reloaded", fields={"code_version": self.job.spec.code_version})

    def _checkpoint_uri(self) -> str:
        """The spec's location (a path confined to the job's folders; s3:// and mem:// as they are),
        or the run's own folder."""
        return self.paths.checkpoint_uri(self.job.spec.checkpoint.uri) or str(self.workdir / "checkpoints")

    def _workers_now(self) -> tuple[int, WorkerGroup | None, WorkerGroup | None]:
        return self.generation, self.group, self._last_group

    def _heartbeat(self, now: float) -> Heartbeat:
        """The heartbeat the lease keeper sends (on its thread): the loop's last snapshot of the workers,
        this node's metric vector (kept in the history window too) and the probes' machine faults."""
        workers, generation, state = self._beat_workers, self.generation, self.state
        vector = node_metric_vector(
            self.node,
            workers,
            host=self.probes.host,
            net_now=self.probes.net_now,
            net_previous=self.probes.net_previous,
            now=now,
        )
        self.history.add(vector, generation)
        self.metrics.update_workers(workers)
        self.metrics.record_heartbeat(generation, now)
        self.metrics.record_node_vector(vector)
        loader = self.data_plane.shadow_loader
        if loader is not None:
            self.metrics.record_loader_lanes([loader.ready_batches(lane) for lane in range(loader.lanes)])
        return Heartbeat(
            node=self.node,
            generation=generation,
            sent_at=now,
            workers=workers,
            vector=vector.model_dump(mode="json"),
            machine_faults=self.probes.machine_faults(),
            agent_state=state.value,
            checkpoints=self._beat_saves,
        )

    def _stop_workers(self, transition: bool = True) -> None:
        if self.group is not None:
            if transition:
                self._enter(AgentState.STOPPING, f"generation {self.generation} ends")
            self.group.stop(self.ft.stop_grace_seconds)
            self._last_group, self.group = self.group, None
            self._beat_workers = []
