"""The node agent: the only thing that touches workers.

It holds its node's lease and renews it with each heartbeat, launches the workers of the generation
the controller commands, reports their progress and exits, and stops them cleanly. All of its state
changes happen on one thread (the loop in `run`); etcd watch callbacks only enqueue.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from stalwart.agents.metrics import MetricsExporter
from stalwart.agents.probe_loop import ProbeLoop
from stalwart.agents.progress_inbox import ProgressInbox
from stalwart.agents.stacks import StackTarget, capture_stacks
from stalwart.agents.warm_pool import WarmPool
from stalwart.agents.worker_sdk import GENERATION_ENV, PROGRESS_SOCKET_ENV, REPLAY_STEPS_ENV
from stalwart.agents.workers import WorkerGroup, tail_lines
from stalwart.checkpoint.memory_auth import TOKEN_ENV, new_token, token_from_env
from stalwart.checkpoint.storage.base import StorageError
from stalwart.health.node_vector import node_metric_vector
from stalwart.logs import get_logger
from stalwart.net import free_port
from stalwart.processes import spawn, stop_process
from stalwart.spec import ConfinementError, PathConfinement, TrainingJob
from stalwart.store import keys
from stalwart.store.client import Lease, LeaseLost, Store, StoreUnavailable
from stalwart.store.credentials import CHECKPOINT_TOKEN_ENV, agent_job_token
from stalwart.store.jobs import read_spec
from stalwart.store.nodes import read_nodes
from stalwart.store.records import (
    AgentAction,
    AgentCommand,
    Assignment,
    Heartbeat,
    JobState,
    LogReport,
    LogRequest,
    NodeRegistration,
    StackReport,
    StackRequest,
    WorkerLog,
)

if TYPE_CHECKING:
    from stalwart.dataloader.shadow_supervisor import ShadowLoaderSupervisor

LOOP_INTERVAL = 0.05
MIRROR_INTERVAL = 1.0  # a standby looks for a newer checkpoint to copy this often
METRICS_PORT_ENV = "STALWART_METRICS_PORT"  # 0 or unset: any free port (it is in the registration)
STACK_TIMEOUT_SECONDS = 8.0
RESUME_MAX_STEP_ENV = "STALWART_RESUME_MAX_STEP"
MEMORY_URI_ENV = "STALWART_CHECKPOINT_MEMORY_URI"  # a rollback: load no checkpoint newer than this


def _prewarm() -> None:
    """Load now what starting workers needs the first time (peer choice, the signature database):
    a standby pays it while it waits, not while the job waits for it. Neither imports torch."""
    from stalwart.checkpoint.peers import choose_peers  # noqa: F401
    from stalwart.signatures import default_database

    default_database()


def replay_scratch_uri(checkpoint_uri: str, generation: int, group: str) -> str:
    """Beside the job's checkpoints, never among them: `<uri>-replay/gen-N/<group>` (query kept)."""
    base, sep, query = checkpoint_uri.partition("?")
    return f"{base.rstrip('/')}-replay/gen-{generation:04d}/{group}{sep}{query}"


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
        self.commands: queue.Queue[AgentCommand] = queue.Queue()
        self.group: WorkerGroup | None = None
        self._last_group: WorkerGroup | None = None  # for log requests between generations
        self.generation = 0
        self.lease: Lease | None = None
        self.inbox = ProgressInbox()
        self._stop_signal: int | None = None
        self._etcd_lost_since: float | None = None
        # Heartbeats (which renew the lease) run on their own thread: starting or stopping workers
        # can take seconds on a loaded machine, and a lease must never lapse because of that.
        self._state_lock = threading.Lock()
        self._beat_now = threading.Event()
        self._stopping = threading.Event()
        self._fatal: AgentExit | None = None
        self._beat_thread: threading.Thread | None = None
        self.metrics = MetricsExporter(job, node)
        self.stack_requests: queue.Queue[StackRequest] = queue.Queue()
        self.log_requests: queue.Queue[LogRequest] = queue.Queue()
        self.shadow_loader: ShadowLoaderSupervisor | None = None  # when the job has a data section
        self.probes = ProbeLoop(self.metrics)
        self.address = os.environ.get("STALWART_NODE_ADDRESS", "127.0.0.1")
        self.memory_store: subprocess.Popen[bytes] | None = None
        self._checkpoint_token: str | None = None
        self._hand_down_job_token()
        self.warm = WarmPool(max(r.processes_per_node for r in self.job.spec.roles), enabled=self.ft.warm_workers)

    # -- lifecycle ---------------------------------------------------------------------------
    def _hand_down_job_token(self) -> None:
        """The job's credential, for the memory store, the warm workers and the workers this agent
        starts (they inherit it), and for its own memory-store client: set before any of them."""
        token = agent_job_token(self.store, self.job_name)
        if token:
            os.environ[CHECKPOINT_TOKEN_ENV] = token
        else:
            # checkpoint_token() then makes the memory stores' own token in etcd.
            self.log.warning("the job has no token in etcd: the memory stores use a checkpoint token of their own")

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum

    def _start_data_plane(self) -> None:
        data = self.job.spec.data
        if data is None:
            return
        from stalwart.agents.data_plane import start_shadow_loader

        lanes = max(r.processes_per_node for r in self.job.spec.roles)
        try:
            loader = start_shadow_loader(data, self.job_dir, self.job_name, self.node, lanes)
        except (FileNotFoundError, ValueError) as exc:
            raise AgentExit(2, f"cannot start the shadow data loader: {exc}") from None
        self.shadow_loader = loader
        self.log.info("shadow loader started", fields={"segment": loader.name})

    def checkpoint_token(self) -> str:
        """The job's token for the memory stores, the same on every node: STALWART_CHECKPOINT_TOKEN
        when the agent was given one, else one per job in etcd (the first agent to ask creates it)."""
        if self._checkpoint_token is None:
            token = token_from_env()
            if token is None:
                key = keys.checkpoint_token(self.job_name)
                self.store.create(key, new_token())
                raw = self.store.get_raw(key)
                if raw is None:
                    raise AgentExit(2, f"the job's checkpoint token at {key} vanished")
                token = raw.decode()
            self._checkpoint_token = token
        return self._checkpoint_token

    def _start_memory_store(self) -> int | None:
        """The node's host-memory checkpoint store: it outlives worker restarts, not the node. It
        listens on the node's address only, and answers only callers holding the job's token."""
        if not self.job.spec.checkpoint.memory:
            return None
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "stalwart.checkpoint.memory_server",
            "--host",
            self.address,
            "--port",
            str(port),
            "--capacity-gib",
            str(self.job.spec.checkpoint.memory_capacity_gib),
        ]
        (self.workdir / "nodes" / self.node).mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "nodes" / self.node / "memory-store.log", "ab")
        env = {**os.environ, TOKEN_ENV: self.checkpoint_token()}  # by environment: argv is public
        self.memory_store = spawn(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        return port

    def register(self) -> None:
        self._start_data_plane()
        memory_port = self._start_memory_store()
        metrics_port = self.metrics.start(
            port=int(os.environ.get(METRICS_PORT_ENV, "0")),
            host=os.environ.get("STALWART_METRICS_HOST") or self.address,
        )
        self.lease = self.store.lease(self.ft.lease_ttl_seconds)
        reg = NodeRegistration(
            node=self.node,
            job=self.job_name,
            host=socket.gethostname(),
            agent_pid=os.getpid(),
            registered_at=time.time(),
            lease_id=self.lease.id,
            metrics_port=metrics_port,
            address=self.address,
            memory_port=memory_port,
        )
        self.store.put(keys.node_registration(self.job_name, self.node), reg, lease=self.lease)
        self.store.watch_prefix(keys.node_command(self.job_name, self.node), self._on_command)
        self.store.watch_prefix(keys.stack_request(self.job_name), self._on_stack_request)
        self.store.watch_prefix(keys.log_request(self.job_name), self._on_log_request)
        self.log.info("registered", fields={"lease": f"{self.lease.id:x}"})
        self._beat_thread = threading.Thread(target=self._beat_loop, name="heartbeat", daemon=True)
        self._beat_thread.start()
        threading.Thread(target=_prewarm, name="prewarm", daemon=True).start()
        if memory_port is not None and self.job.spec.standbys.preload_checkpoint:
            threading.Thread(
                target=self._mirror_loop, args=(f"{self.address}:{memory_port}",), name="mirror", daemon=True
            ).start()
        self.probes.start()
        # A command written before our watch started is not replayed by the watch: read it once.
        current = self.store.get(keys.node_command(self.job_name, self.node), AgentCommand)
        if current is not None:
            self.commands.put(current)

    def _on_command(self, _key: str, value: bytes | None) -> None:
        if value is not None:
            self.commands.put(AgentCommand.loads(value))

    def _on_stack_request(self, _key: str, value: bytes | None) -> None:
        if value is not None:
            self.stack_requests.put(StackRequest.loads(value))

    def _on_log_request(self, _key: str, value: bytes | None) -> None:
        if value is not None:
            self.log_requests.put(LogRequest.loads(value))

    def _report_logs(self, request: LogRequest) -> None:
        """The tail of each worker's output (the running generation's, or the last one's)."""
        group = self.group or self._last_group
        workers = [
            WorkerLog(
                rank=w.rank,
                local_rank=w.local_rank,
                lines=tail_lines(w.log_path, lines=request.lines, max_bytes=256 * 1024),
            )
            for w in (group.workers if group else [])
            if request.rank is None or w.rank == request.rank
        ]
        report = LogReport(request_id=request.id, node=self.node, generation=self.generation, workers=workers)
        try:
            self.store.put(keys.log_report(self.job_name, request.id, self.node), report)
        except StoreUnavailable as exc:
            self.log.warning("could not store logs", fields={"request": request.id, "error": str(exc)})

    def _capture_stacks(self, request: StackRequest) -> None:
        """Runs on its own thread: capturing takes seconds, and heartbeats must not wait for it."""
        group = self.group
        targets = [StackTarget(pid, rank, log) for pid, rank, log in (group.stack_targets() if group else [])]
        dumps = capture_stacks(targets, timeout=STACK_TIMEOUT_SECONDS)
        report = StackReport(
            request_id=request.id,
            node=self.node,
            generation=self.generation,
            captured_at=time.time(),
            stacks=[d.model_dump(mode="json") for d in dumps],
        )
        try:
            self.store.put(keys.stack_report(self.job_name, request.id, self.node), report)
            self.log.info(
                "stacks captured",
                fields={
                    "request": request.id,
                    "workers": len(dumps),
                    "methods": sorted({d.method.value for d in dumps}),
                },
            )
        except StoreUnavailable as exc:
            self.log.warning("could not store stacks", fields={"request": request.id, "error": str(exc)})

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            self.register()
            while self._stop_signal is None:
                if self._fatal is not None:
                    raise self._fatal
                with self._state_lock:
                    dirty = self._tick()
                if dirty:
                    self._beat_now.set()
                time.sleep(LOOP_INTERVAL)
            self.log.info("stopping on signal", fields={"signal": self._stop_signal})
            return 0
        except AgentExit as exc:
            self.log.warning("agent exiting", fields={"reason": str(exc), "code": exc.code})
            return exc.code
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._stopping.set()
        self._beat_now.set()
        if self._beat_thread is not None:
            self._beat_thread.join(timeout=10)
        self._stop_workers()
        self.warm.close()
        if self.memory_store is not None:
            stop_process(self.memory_store, grace=2.0)
        self.inbox.close()
        self.probes.stop()
        self.metrics.stop()
        if self.shadow_loader is not None:
            self.shadow_loader.close()
        if self.lease is not None:
            try:
                self.lease.revoke()  # the controller sees the node go at once, not after the TTL
            except (StoreUnavailable, LeaseLost):
                pass
        self.store.close()

    # -- the loop ------------------------------------------------------------------------------
    def _tick(self) -> bool:
        """One pass over commands, requests and workers; True if a heartbeat should go out now."""
        dirty = False
        self.warm.maintain()
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                break
            dirty |= self._apply(cmd)
        while True:
            try:
                request = self.stack_requests.get_nowait()
            except queue.Empty:
                break
            threading.Thread(target=self._capture_stacks, args=(request,), name="stacks", daemon=True).start()
        while True:
            try:
                log_request = self.log_requests.get_nowait()
            except queue.Empty:
                break
            self._report_logs(log_request)
        if self.group is not None:
            for report in self.inbox.drain():
                self.group.record(report)
                self.metrics.record_report(report)
            exited, exit_matches = self.group.poll()
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
        return dirty

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
                return True
            return False
        if cmd.generation == self.generation and self.group is not None:
            return False  # already running this generation (a replayed command)
        assignment = self.store.get(keys.generation(self.job_name, cmd.generation), Assignment)
        mine = assignment.for_node(self.node) if assignment else None
        if assignment is None or mine is None:
            self.log.warning("command for a generation without my assignment", fields={"generation": cmd.generation})
            return False
        self._stop_workers()
        self.generation = cmd.generation
        if assignment.code_version != self.job.spec.code_version:
            self._reload_spec()  # a lazy hot update: the new code starts with this generation
        role = next(r for r in self.job.spec.roles if r.name == mine.role)
        try:
            working_dir = self.paths.working_dir(role)
            checkpoint_uri = self._checkpoint_uri()
        except ConfinementError as exc:
            raise AgentExit(2, f"refusing the job's spec: {exc}") from None
        env = {
            **os.environ,
            **role.env,
            "STALWART_JOB": self.job_name,
            "STALWART_NODE": self.node,
            GENERATION_ENV: str(cmd.generation),
            PROGRESS_SOCKET_ENV: self.inbox.path,
            "STALWART_CHECKPOINT_URI": checkpoint_uri,
            "STALWART_CHECKPOINT_INTERVAL": str(self.job.spec.checkpoint.interval_steps),
            "STALWART_CHECKPOINT_KEEP": str(self.job.spec.checkpoint.keep_last),
        }
        replay = assignment.replay_steps is not None
        memory_uri = None if replay else self._memory_uri(assignment)
        if memory_uri:
            env[MEMORY_URI_ENV] = memory_uri
            env[TOKEN_ENV] = self.checkpoint_token()
        if assignment.resume_max_step is not None and not replay:
            env[RESUME_MAX_STEP_ENV] = str(assignment.resume_max_step)
        if assignment.code_version is not None:
            env["STALWART_CODE_VERSION"] = assignment.code_version
        if replay:
            # A replay group trains from scratch at its own size: its checkpoints go to a scratch
            # folder, never over the job's, and it reads its data in process (the shadow loader
            # serves the job's layout, not the group's).
            env[REPLAY_STEPS_ENV] = str(assignment.replay_steps)
            env["STALWART_CHECKPOINT_URI"] = replay_scratch_uri(checkpoint_uri, cmd.generation, mine.group or self.node)
        if self.shadow_loader is not None and self.job.spec.data is not None:
            from stalwart.agents.data_plane import CONFIG_ENV
            from stalwart.dataloader import SHM_ENV

            if not replay:
                env[SHM_ENV] = self.shadow_loader.name
            env[CONFIG_ENV] = self.shadow_loader.config.model_dump_json()
            env["STALWART_DATA_MICRO_BATCH"] = str(self.job.spec.data.micro_batch)
        self.group = WorkerGroup(
            assignment,
            mine,
            role.command,
            env,
            working_dir,
            self.workdir / "nodes" / self.node / f"gen-{cmd.generation:04d}",
            launcher=self.warm.launch,
        )
        self.log.info(
            "workers started",
            fields={
                "generation": cmd.generation,
                "ranks": [w.rank for w in self.group.workers],
                "pids": [w.proc.pid for w in self.group.workers],
                "warm": self.group.warm_starts,
                "lag": round(time.time() - cmd.issued_at, 3),  # since the controller issued the command
            },
        )
        return True

    def _memory_uri(self, assignment: Assignment) -> str | None:
        """This node's memory store, its peer (outside its parallel groups) for the second copy, and
        every node of the generation to read from after a node was replaced."""
        from stalwart.checkpoint.peers import choose_peers

        registrations = read_nodes(self.store, self.job_name).registrations
        stores = {
            n.node: f"{r.address}:{r.memory_port}"
            for n in assignment.nodes
            if (r := registrations.get(n.node)) is not None and r.memory_port
        }
        if self.node not in stores:
            return None
        rank_nodes = assignment.rank_nodes()
        peer = choose_peers(rank_nodes, [list(rank_nodes)]).get(self.node)
        query = [f"peer={stores[peer]}"] if peer in stores else []
        query.append("nodes=" + ",".join(stores[n] for n in sorted(stores) if n != self.node))
        return f"mem://{stores[self.node]}/{self.job_name}?" + "&".join(query)

    def _mirror_loop(self, local: str) -> None:
        """While this node is a standby, keep the job's newest in-memory checkpoint in its own store:
        the ranks it may take over then load locally (see stalwart.checkpoint.memory_mirror)."""
        from stalwart.checkpoint.memory_mirror import sync_newest

        budget = int(self.job.spec.checkpoint.memory_capacity_gib * (1 << 30) / 2)
        held, said = None, None
        while not self._stopping.wait(MIRROR_INTERVAL):
            try:
                state = self.store.get(keys.job_state(self.job_name), JobState)
                if state is None or self.node not in state.standbys:
                    continue
                registrations = read_nodes(self.store, self.job_name).registrations
                sources = [
                    f"{r.address}:{r.memory_port}"
                    for n, r in registrations.items()
                    if n in state.slots and r.memory_port
                ]
                token = self.checkpoint_token()
                result = sync_newest(local, sources, self.job_name, budget, token) if sources else None
            except (StoreUnavailable, StorageError) as exc:
                self.log.debug("checkpoint mirror skipped a round", fields={"error": str(exc)})
                continue
            if result is not None and result.step != held:
                held = result.step
                self.log.info(
                    "standby holds the newest checkpoint", fields={"step": held, "bytes": result.copied_bytes}
                )
            if result is not None and result.skipped and result.skipped != said:
                said = result.skipped
                self.log.warning("standby cannot hold the newest checkpoint", fields={"why": said})

    def _reload_spec(self) -> None:
        spec = read_spec(self.store, self.job_name)
        if spec is not None:
            self.job = spec
            self.log.info("job spec reloaded", fields={"code_version": self.job.spec.code_version})

    def _checkpoint_uri(self) -> str:
        """The spec's location (a path confined to the job's folders; s3:// and mem:// as they are),
        or the run's own folder."""
        return self.paths.checkpoint_uri(self.job.spec.checkpoint.uri) or str(self.workdir / "checkpoints")

    def _beat_loop(self) -> None:
        """Renew the lease and report, every interval and whenever the main loop asks."""
        assert self.lease is not None
        workers: list = []
        generation = 0
        while not self._stopping.is_set():
            self._beat_now.wait(timeout=self.ft.heartbeat_interval_seconds)
            self._beat_now.clear()
            if self._stopping.is_set():
                return
            # A main loop busy for a while (stopping workers) must not hold the lease hostage:
            # then the last snapshot goes out again.
            if self._state_lock.acquire(timeout=0.2):
                try:
                    workers = self.group.statuses() if self.group else []
                    generation = self.generation
                finally:
                    self._state_lock.release()
            now = time.time()
            vector = node_metric_vector(
                self.node,
                workers,
                host=self.probes.host,
                net_now=self.probes.net_now,
                net_previous=self.probes.net_previous,
                now=now,
            )
            beat = Heartbeat(
                node=self.node,
                generation=generation,
                sent_at=now,
                workers=workers,
                vector=vector.model_dump(mode="json"),
                machine_faults=self.probes.machine_faults(),
            )
            self.metrics.update_workers(workers)
            self.metrics.record_heartbeat(generation, now)
            self.metrics.record_node_vector(vector)
            if self.shadow_loader is not None:
                self.metrics.record_loader_lanes(
                    [self.shadow_loader.ready_batches(lane) for lane in range(self.shadow_loader.lanes)]
                )
            try:
                self.lease.refresh()
                self.store.put(keys.node_heartbeat(self.job_name, self.node), beat, lease=self.lease)
                self._etcd_lost_since = None
            except LeaseLost:
                # The controller has already counted this node as lost: we are fenced off.
                self._fatal = AgentExit(3, "node lease expired; this node has been replaced")
                return
            except StoreUnavailable as exc:
                self._etcd_lost_since = self._etcd_lost_since or now
                if now - self._etcd_lost_since > 3 * self.ft.lease_ttl_seconds:
                    self._fatal = AgentExit(4, f"etcd unreachable for too long: {exc}")
                    return

    def _stop_workers(self) -> None:
        if self.group is not None:
            self.group.stop(self.ft.stop_grace_seconds)
            self._last_group, self.group = self.group, None
