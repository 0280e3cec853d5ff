"""Many simulated node agents in one process, against a real etcd.

Each simulated node makes the etcd calls that the real agent (stalwart.agents.agent.NodeAgent)
makes, with the same records (so the same sizes), but runs no workers: its workers' statuses follow
the clock (a first step `first_step_after` seconds into the generation, then one every `step_time`;
every node in lock-step, as synchronous training is). The calls go straight to etcd's gRPC API
(grpc.aio over pyetcd's generated stubs) so that one process holds thousands of nodes, with the
limits the real agent's client has (replies of at most 4 MiB, 5 s deadlines). What the real agent
does, and so what `SimNode` does:

    register      LeaseGrant(ttl); Range(spec); Put(registration, lease); Watch x3 (its command key,
                  the stack-request key, the log-request key); Range(its command); Range(job state),
                  once, to learn whether it is a standby
    every beat    a LeaseKeepAlive message on a long-lived stream (the agent: one stream of its own;
                  here: one stream per channel, shared by its nodes, every node's message on it);
                  no write just to be alive
    heartbeat     Put(heartbeat, lease) by stalwart.store.heartbeat_budget's rule: at once when
                  something the controller acts on changed (a command applied, the first step of a
                  generation, a checkpoint), otherwise at most once per progress interval
                  (max(heartbeat interval, nodes / 500))
    RUN command   Range(the generation's assignment), which also names every node's memory store;
                  a read that fails (a 5 s deadline under a generation start's burst of reads) is
                  tried again at the agent's next idle pass (the agent keeps the command until etcd
                  answers: NodeAgent._apply_commands), and counted
    STOP command  the workers stop; the heartbeats then carry none
    SHUTDOWN      LeaseRevoke; the agent exits
    stack request Put(stack report: one py-spy dump per worker)
    log request   Put(log report)
    standby       only a node the job state lists as a standby, and only while it is one (promoted
                  by RUN): Watch(the job's checkpoint catalog); a round (Range(job state), Range(a slot
                  node's heartbeat), Range(the generation's assignment)) once at registration and at
                  each new catalog entry
    lease lost    (a keep-alive answers TTL 0) the agent exits
    SIGTERM       LeaseRevoke; the agent exits

The nodes of one process beat from one timer wheel (a slot every 1/20 of the interval, each node in
a random slot), not one task per node: the etcd traffic is the agent's, the simulator's CPU per node
is as low as it goes. A heartbeat record is built only when it may be due (the rule's progress
clock ran out, or the clock-driven workers reached a step the rule writes at once); the rule itself
(`HeartbeatGate.due`) then decides, as in the agent.

Edit this list and `SimNode` together when the agent changes; records come from
stalwart.store.records, so a changed record changes the simulation with it.

The process measures its own cost (event-loop lag, call latencies, beats that came late) so that a
report can tell a saturated simulator from a saturated control plane. The bench and the simulated
cluster drive it over a Unix socket (support.scale.hostlink).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import socket
import time
import zlib
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from pyetcd.etcdrpc import kv_pb2
from pyetcd.etcdrpc import rpc_pb2 as pb
from pyetcd.etcdrpc import rpc_pb2_grpc as rpc

from stalwart.agents.agent import IDLE_LOOP_INTERVAL
from stalwart.agents.stacks import StackDump, StackMethod
from stalwart.diagnosis.corpus import PID_MARK
from stalwart.health.node_vector import node_metric_vector
from stalwart.spec import TrainingJob, parse_job
from stalwart.store import keys
from stalwart.store.heartbeat_budget import HeartbeatGate, job_progress_interval, progress_phase
from stalwart.store.records import (
    AgentAction,
    AgentCommand,
    Assignment,
    Heartbeat,
    JobState,
    LogReport,
    LogRequest,
    NodeAssignment,
    NodeRegistration,
    SavedCheckpoint,
    StackReport,
    StackRequest,
    WorkerLog,
    WorkerState,
    WorkerStatus,
)
from support.scale.keepalive_wire import KeepAliveWire

DEADLINE = 5.0  # the agent's Store(timeout=5.0)
WHEEL_SLOTS = 20  # the beat wheel turns a slot every 1/20 of the heartbeat interval
TOKENS_PER_STEP = 4 * 1024 * 1024  # per rank: a 4M-token global batch's share, for a realistic figure
STACK_CASE = Path(__file__).resolve().parents[2] / "data" / "diagnosis" / "corpus"


def _stack_texts() -> tuple[str, str]:
    """A healthy rank's and a stuck rank's py-spy dump, from the diagnosis corpus (real captures)."""
    import gzip

    case = json.loads((STACK_CASE / "cases" / "hang-example-ddp-r1.json").read_text())
    texts = json.loads(gzip.open(STACK_CASE / "stacks.json.gz").read())
    faulty = set(case["truth"]["faulty_nodes"])
    healthy = next(s for s in case["stacks"] if s["node"] not in faulty)
    stuck = next(s for s in case["stacks"] if s["node"] in faulty and len(texts[s["text_ref"]]) < 1000)
    return texts[healthy["text_ref"]], texts[stuck["text_ref"]]


def _prefix_end(key: bytes) -> bytes:
    """etcd's range end for 'every key starting with `key`'."""
    end = bytearray(key)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def running_workers(first_rank: int, count: int, started_at: float, seed: str) -> list[WorkerStatus]:
    """A new generation's workers, as the agent's WorkerGroup starts them."""
    return [
        WorkerStatus(
            local_rank=i,
            rank=first_rank + i,
            pid=100_000 + zlib.crc32(f"{seed}/{i}".encode()) % 800_000,
            state=WorkerState.RUNNING,
            started_at=started_at,
        )
        for i in range(count)
    ]


def advance_workers(
    workers: list[WorkerStatus],
    started_at: float,
    at: float,
    *,
    first_step_after: float,
    step_time: float,
    checkpoint_interval: int,
) -> None:
    """The workers' statuses as their SDK's progress reports would have left them at `at`."""
    first = started_at + first_step_after
    if at < first:
        return
    done = int((at - first) // step_time) + 1
    last_at = first + (done - 1) * step_time
    loss = 1.0 + 2.0 * math.exp(-done / 2000.0)
    for w in workers:
        if w.first_step is None:
            w.first_step, w.first_step_at, w.first_loss = 1, first, 1.0 + 2.0 * math.exp(-1 / 2000.0)
        w.step, w.loss, w.step_time, w.last_progress_at = done, loss, step_time, last_at
        w.tokens_per_second = TOKENS_PER_STEP / step_time
        w.last_checkpoint_step = done // checkpoint_interval * checkpoint_interval or None


def heartbeat_record(
    node: str, generation: int, workers: list[WorkerStatus], now: float, agent_state: str | None = None
) -> Heartbeat:
    """The agent's heartbeat: its workers' statuses, the node metric vector (host probes filled in),
    its state and its ranks' newest committed checkpoint (which feeds the job's catalog)."""
    vector = node_metric_vector(node, workers, now=now)
    vector.cpu_percent, vector.memory_percent, vector.nic_error_delta = 41.5, 37.25, 0
    step = workers[0].last_checkpoint_step if workers else None
    saves = [SavedCheckpoint(step=step, generation=generation, committed_at=now, tiers=["memory"])] if step else []
    return Heartbeat(
        node=node,
        generation=generation,
        sent_at=now,
        workers=workers,
        vector=vector.model_dump(mode="json"),
        machine_faults=[],
        agent_state=agent_state,
        checkpoints=saves,
    )


def registration_record(node: str, job: str, lease_id: int, index: int, memory: bool) -> NodeRegistration:
    return NodeRegistration(
        node=node,
        job=job,
        host=socket.gethostname(),
        agent_pid=os.getpid(),
        registered_at=time.time(),
        lease_id=lease_id,
        metrics_port=20000 + index % 40000,
        address="127.0.0.1",
        memory_port=30000 + index % 30000 if memory else None,
    )


class Stats:
    """What this process saw since the last reset: its own cost and the calls it made."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.since = time.time()
        self.cpu_at_reset = time.process_time()
        self.beats = 0
        self.beat_errors: Counter[str] = Counter()
        self.gaps: list[float] = []  # between two landed beats of one node
        self.keepalive_s: list[float] = []
        self.put_s: list[float] = []
        self.loop_lag_s: list[float] = []
        self.calls: Counter[str] = Counter()
        self.reply_bytes: Counter[str] = Counter()
        self.sent_bytes: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.exits: Counter[str] = Counter()
        self.read_timeouts: Counter[str] = Counter()  # reads an agent retries (its command waits)
        self.lease_lost: list[str] = []

    def snapshot(self, interval: float) -> dict[str, Any]:
        elapsed = max(1e-9, time.time() - self.since)
        late = [g for g in self.gaps if g > 1.5 * interval]
        return {
            "seconds": elapsed,
            "cpu_seconds": time.process_time() - self.cpu_at_reset,
            "beats": self.beats,
            "beats_per_second": self.beats / elapsed,
            "beat_errors": dict(self.beat_errors),
            "gap_count": len(self.gaps),
            "gap_p50_s": _pct(self.gaps, 0.5),
            "gap_p99_s": _pct(self.gaps, 0.99),
            "gap_max_s": max(self.gaps, default=None),
            "late_beats": len(late),  # landed more than 1.5 intervals after the node's previous one
            "keepalive_p50_s": _pct(self.keepalive_s, 0.5),
            "keepalive_p99_s": _pct(self.keepalive_s, 0.99),
            "put_p50_s": _pct(self.put_s, 0.5),
            "put_p99_s": _pct(self.put_s, 0.99),
            "loop_lag_p50_s": _pct(self.loop_lag_s, 0.5),
            "loop_lag_p99_s": _pct(self.loop_lag_s, 0.99),
            "loop_lag_max_s": max(self.loop_lag_s, default=None),
            "calls": dict(self.calls),
            "reply_bytes": dict(self.reply_bytes),
            "sent_bytes": dict(self.sent_bytes),
            "errors": dict(self.errors),
            "exits": dict(self.exits),
            "read_timeouts": dict(self.read_timeouts),
            "lease_lost": self.lease_lost[:50],
            "lease_lost_count": len(self.lease_lost),
        }


class Conn:
    """One gRPC channel to etcd, shared by a few simulated nodes, with one Watch stream on it (as a
    client multiplexes its watches). Default channel options: the real agent's 4 MiB reply limit."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.aio.insecure_channel(endpoint)
        self.kv = rpc.KVStub(self.channel)
        self.leases = rpc.LeaseStub(self.channel)
        self._watch_stub = rpc.WatchStub(self.channel)
        self._stream: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: deque[tuple[asyncio.Future[int], Callable[[Any], None]]] = deque()
        self._handlers: dict[int, Callable[[Any], None]] = {}
        self._lock = asyncio.Lock()
        self.users = 0
        # The keep-alive stream: every node of this channel sends its renewals on it, replies come
        # back by lease ID (support.scale.keepalive_wire: the same messages, at a fraction of the CPU).
        self.endpoint = endpoint
        self._wire: KeepAliveWire | None = None
        self.by_lease: dict[int, SimNode] = {}
        self.streams_opened = 0

    async def watch(self, key: bytes, handler: Callable[[Any], None]) -> int:
        """A prefix watch on `key` (pyetcd's add_watch_prefix_callback); handler(event) per event."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        async with self._lock:
            if self._stream is None:
                self._stream = self._watch_stub.Watch()
                self._reader = asyncio.create_task(self._read())
            self._pending.append((future, handler))
            create = pb.WatchCreateRequest(key=key, range_end=_prefix_end(key))
            await self._stream.write(pb.WatchRequest(create_request=create))
        return await asyncio.wait_for(future, DEADLINE)

    async def cancel(self, watch_id: int) -> None:
        self._handlers.pop(watch_id, None)
        if self._stream is None:
            return
        async with self._lock:
            await self._stream.write(pb.WatchRequest(cancel_request=pb.WatchCancelRequest(watch_id=watch_id)))

    async def _read(self) -> None:
        try:
            async for response in self._stream:
                if response.created:
                    future, handler = self._pending.popleft()
                    self._handlers[response.watch_id] = handler  # before any event can arrive for it
                    if not future.done():
                        future.set_result(response.watch_id)
                    continue
                if response.canceled:
                    self._handlers.pop(response.watch_id, None)
                    continue
                found = self._handlers.get(response.watch_id)
                if found is not None:
                    for event in response.events:
                        found(event)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            return

    async def keep_alive(self, lease_ids: list[int]) -> None:
        """Send these leases' renewals on the channel's stream (opened now if it is not, or broke)."""
        if self._wire is None or self._wire.broken:
            host, _, port = self.endpoint.rpartition(":")
            wire = KeepAliveWire(host, int(port), self._renewed)
            await wire.open()
            self._wire = wire
            self.streams_opened += 1
        self._wire.send(lease_ids)

    def _renewed(self, lease_id: int, ttl: int) -> None:
        node = self.by_lease.get(lease_id)
        if node is not None:
            node.renewed(ttl)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._wire is not None:
            self._wire.close()
        await self.channel.close()


class SimNode:
    """One node agent's etcd behaviour (see the module's list), with clock-driven workers."""

    def __init__(self, host: NodeHost, name: str, conn: Conn) -> None:
        self.host = host
        self.name = name
        self.conn = conn
        self.alive = True  # the agent runs (the cluster lists it alive)
        self.silent = False  # killed: the machine went quiet; its lease is left to lapse
        self.lease_id = 0
        self.registered_at: float | None = None
        self.generation = 0
        self.running = False  # a worker group exists (the agent's self.group)
        self.workers: list[WorkerStatus] = []
        self.mine: NodeAssignment | None = None
        self.gen_started_at = 0.0
        self.frozen_at: float | None = None
        self.lock = asyncio.Lock()  # one command at a time: the agent applies them on one thread
        self.tasks: list[asyncio.Task[Any]] = []
        self.watch_ids: list[int] = []
        self.last_landed: float | None = None
        self.last_keepalive_sent: float | None = None  # the renewal etcd last granted was sent then
        self.keepalive_sent_at = 0.0  # the newest renewal sent
        self.gate = HeartbeatGate(host.interval, host.progress_interval, progress_phase(name, host.progress_interval))
        self.written_hint: tuple[Any, ...] | None = None  # what the last written heartbeat's workers were at
        self.standby = False  # the job state lists it as a standby (read at registration)
        self.catalog_watch: int | None = None
        self.exit_reason: str | None = None

    # -- etcd calls, counted -----------------------------------------------------------------
    async def _call(self, kind: str, call: Awaitable[Any], sent: int = 0) -> Any:
        stats = self.host.stats
        stats.calls[kind] += 1
        stats.sent_bytes[kind] += sent
        try:
            reply = await call
        except grpc.aio.AioRpcError as exc:
            stats.errors[f"{kind}: {exc.code().name}"] += 1
            raise
        stats.reply_bytes[kind] += reply.ByteSize() if hasattr(reply, "ByteSize") else 0
        return reply

    async def _range(self, kind: str, key: str, prefix: bool = False) -> Any:
        k = key.encode()
        request = pb.RangeRequest(key=k, range_end=_prefix_end(k) if prefix else b"")
        if not prefix:
            return await self._call(kind, self.conn.kv.Range(request, timeout=DEADLINE))
        # Whole-prefix reads: a real cluster's agents would send them all at once, each from its own
        # machine; here one process receives them all, so it takes a few at a time to keep its
        # heartbeats flowing (every read still reaches etcd, spread over a longer time).
        async with self.host.bulk_reads:
            return await self._call(kind, self.conn.kv.Range(request, timeout=DEADLINE))

    async def _put(self, kind: str, key: str, value: str, lease: int = 0) -> None:
        data = value.encode()
        request = pb.PutRequest(key=key.encode(), value=data, lease=lease)
        await self._call(kind, self.conn.kv.Put(request, timeout=DEADLINE), sent=len(data))

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self.tasks.append(asyncio.create_task(self._life()))

    async def _life(self) -> None:
        try:
            await self._register()
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            await self.exit(f"could not register: {type(exc).__name__}", revoke=True)
            return
        self.host.wheel_add(self)
        if self.standby and self.host.mirror and self.alive:
            try:
                self.host.stats.calls["watch create"] += 1
                catalog = keys.checkpoints_prefix(self.host.job).encode()
                self.catalog_watch = await self.conn.watch(catalog, self._on_catalog)
            except (grpc.aio.AioRpcError, TimeoutError):
                return  # the agent logs "standby round skipped" and tries again
            self._spawn(self._standby_round())

    async def _register(self) -> None:
        host, job = self.host, self.host.job
        reply = await self._range("range spec", keys.job_spec(job))
        if reply.kvs:
            host.parsed_spec(reply.kvs[0])
        grant = await self._call(
            "lease grant", self.conn.leases.LeaseGrant(pb.LeaseGrantRequest(TTL=host.ttl), timeout=DEADLINE)
        )
        self.lease_id = grant.ID
        self.last_keepalive_sent = self.last_landed = time.time()
        self.conn.by_lease[self.lease_id] = self
        registration = registration_record(self.name, job, self.lease_id, len(host.nodes), host.memory)
        await self._put("put registration", keys.node_registration(job, self.name), registration.dumps(), self.lease_id)
        for key, handler in (
            (keys.node_command(job, self.name), self._on_command),
            (keys.stack_request(job), self._on_stack_request),
            (keys.log_request(job), self._on_log_request),
        ):
            self.host.stats.calls["watch create"] += 1
            self.watch_ids.append(await self.conn.watch(key.encode(), handler))
        self.registered_at = time.time()
        reply = await self._range("range command", keys.node_command(job, self.name))
        if reply.kvs:
            self._spawn(self._apply(AgentCommand.loads(reply.kvs[0].value)))
        reply = await self._range("range job state (register)", keys.job_state(job))
        self.standby = bool(reply.kvs) and self.name in host.standbys(reply.kvs[0])

    def _spawn(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.append(task)
        task.add_done_callback(lambda t: self.tasks.remove(t) if t in self.tasks else None)

    async def exit(self, reason: str, revoke: bool) -> None:
        """The agent process ends (revoking its lease when it can, as its shutdown does)."""
        if not self.alive and self.exit_reason is not None:
            return
        self.alive, self.exit_reason = False, reason
        self.host.stats.exits[reason] += 1
        current = asyncio.current_task()
        for task in list(self.tasks):
            if task is not current:
                task.cancel()
        self.conn.by_lease.pop(self.lease_id, None)
        for watch_id in [*self.watch_ids, *([self.catalog_watch] if self.catalog_watch is not None else [])]:
            try:
                await self.conn.cancel(watch_id)
            except (grpc.aio.AioRpcError, RuntimeError):
                pass
        self.watch_ids.clear()
        self.catalog_watch = None
        if revoke and self.lease_id and not self.silent:
            try:
                await self._call(
                    "lease revoke",
                    self.conn.leases.LeaseRevoke(pb.LeaseRevokeRequest(ID=self.lease_id), timeout=DEADLINE),
                )
            except grpc.aio.AioRpcError:
                pass

    async def kill(self, exited: bool) -> dict[str, Any]:
        """The machine dies: no more beats or answers, its lease left to lapse. `exited`: the cluster
        sees it dead at once (a process exit, a failed pod); otherwise only the lease tells."""
        self.silent = True
        killed_at = time.time()
        await self.exit("killed", revoke=False)
        self.alive = not exited
        return {"node": self.name, "killed_at": killed_at, "last_keepalive_sent": self.last_keepalive_sent}

    # -- commands --------------------------------------------------------------------------------
    def _on_command(self, event: Any) -> None:
        if event.type == kv_pb2.Event.PUT and self.alive and not self.silent:
            self._spawn(self._apply(AgentCommand.loads(event.kv.value)))

    async def _apply(self, cmd: AgentCommand) -> None:
        async with self.lock:
            if not self.alive or self.silent:
                return
            if cmd.action is AgentAction.SHUTDOWN:
                await self.exit("job finished", revoke=True)
                return
            if cmd.generation < self.generation:
                return
            if cmd.action is AgentAction.STOP:
                if self.running:
                    self.running, self.workers, self.generation = False, [], cmd.generation
                    self.host.urgent.append(self)
                return
            if cmd.generation == self.generation and self.running:
                return
            job = self.host.job
            while True:
                try:
                    reply = await self._range("range assignment", keys.generation(job, cmd.generation))
                    break
                except grpc.aio.AioRpcError as exc:
                    # StoreUnavailable: the agent keeps the command and applies it again at its next pass.
                    self.host.stats.read_timeouts[f"range assignment: {exc.code().name}"] += 1
                    await asyncio.sleep(IDLE_LOOP_INTERVAL)
                    if not self.alive or self.silent:
                        return
            mine = self.host.assignment_for(reply.kvs[0], self.name) if reply.kvs else None
            if mine is None:
                return  # the agent logs "command for a generation without my assignment"
            # _memory_uri: the memory stores come with the assignment (no other read).
            now = time.time()
            self.generation, self.mine, self.running = cmd.generation, mine, True
            self.gen_started_at, self.frozen_at = now, None
            self.workers = running_workers(mine.first_rank, mine.local_world_size, now, self.name)
            if self.standby:  # promoted: its standby duty ends
                self.standby = False
                if self.catalog_watch is not None:
                    watch, self.catalog_watch = self.catalog_watch, None
                    await self.conn.cancel(watch)
            self.host.urgent.append(self)

    def _on_stack_request(self, event: Any) -> None:
        if event.type == kv_pb2.Event.PUT and self.alive and not self.silent:
            self._spawn(self._report_stacks(StackRequest.loads(event.kv.value)))

    async def _report_stacks(self, request: StackRequest) -> None:
        await asyncio.sleep(self.host.stack_seconds)  # py-spy's capture time
        if not self.alive or self.silent:
            return
        healthy, stuck = self.host.stack_texts
        culprit = self.name == self.host.culprit and self.frozen_at is not None
        dumps = [
            StackDump(
                rank=w.rank,
                pid=w.pid,
                method=StackMethod.PY_SPY_NATIVE,
                text=(stuck if culprit and w.local_rank == 0 else healthy).replace(PID_MARK, str(w.pid)),
            ).model_dump(mode="json")
            for w in (self.workers if self.running else [])
        ]
        report = StackReport(
            request_id=request.id, node=self.name, generation=self.generation, captured_at=time.time(), stacks=dumps
        )
        try:
            await self._put("put stack report", keys.stack_report(self.host.job, request.id, self.name), report.dumps())
        except grpc.aio.AioRpcError:
            pass  # the agent logs "could not store stacks"

    def _on_log_request(self, event: Any) -> None:
        if event.type == kv_pb2.Event.PUT and self.alive and not self.silent:
            self._spawn(self._report_logs(LogRequest.loads(event.kv.value)))

    async def _report_logs(self, request: LogRequest) -> None:
        workers = [
            WorkerLog(rank=w.rank, local_rank=w.local_rank, lines=[])
            for w in self.workers
            if request.rank is None or w.rank == request.rank
        ]
        report = LogReport(request_id=request.id, node=self.name, generation=self.generation, workers=workers)
        try:
            await self._put("put log report", keys.log_report(self.host.job, request.id, self.name), report.dumps())
        except grpc.aio.AioRpcError:
            pass

    # -- heartbeats ------------------------------------------------------------------------------
    def _advance_workers(self, now: float) -> None:
        """The workers' progress by `now`, or by the freeze (a hang)."""
        if self.running:
            advance_workers(
                self.workers,
                self.gen_started_at,
                now if self.frozen_at is None else min(now, self.frozen_at),
                first_step_after=self.host.first_step_after,
                step_time=self.host.step_time,
                checkpoint_interval=self.host.checkpoint_interval,
            )

    def heartbeat(self, now: float) -> Heartbeat:
        self._advance_workers(now)
        state = "running" if self.running else "standby" if self.standby else "idle"
        return heartbeat_record(self.name, self.generation, self.workers if self.running else [], now, state)

    def progress_hint(self, now: float) -> tuple[Any, ...]:
        """Cheap, from the clock alone: what the workers' statuses hold that the write rule writes at
        once (a generation, its first step, a checkpoint). A heartbeat is built only when this
        changed or the rule's progress clock ran out: most beats of most nodes build nothing."""
        if not self.running:
            return (self.generation, False)
        at = now if self.frozen_at is None else min(now, self.frozen_at)
        first = self.gen_started_at + self.host.first_step_after
        done = int((at - first) // self.host.step_time) + 1 if at >= first else 0
        ci = self.host.checkpoint_interval
        saves = done // ci if ci and self.gate.saves_at_once else None  # else they go with the progress
        return (self.generation, True, done > 0, saves)

    def beat(self, now: float) -> bool:
        """One beat, from the host's wheel: True if a keep-alive is to go out for this node (the wheel
        sends its slot's renewals together, per channel); then the heartbeat, if the rule says it is due."""
        if now - (self.last_landed or now) > 3 * self.host.ttl:
            self._spawn(self.exit("etcd unreachable for too long", revoke=False))
            return False
        self.keepalive_sent_at = now
        hint = self.progress_hint(now)
        if hint != self.written_hint or self.gate.progress_due(now):
            beat = self.heartbeat(now)
            if self.gate.due(beat, now):
                self.gate.wrote(beat, now)  # at once: a put in flight is not sent twice
                self.written_hint = hint
                self._spawn(self._put_heartbeat(beat))
        return True

    async def _put_heartbeat(self, beat: Heartbeat) -> None:
        t0 = time.perf_counter()
        try:
            await self._put("put heartbeat", keys.node_heartbeat(self.host.job, self.name), beat.dumps(), self.lease_id)
        except grpc.aio.AioRpcError:
            self.gate.forget()  # not written: the next beat writes it
            self.written_hint = None
            return
        self.host.stats.put_s.append(time.perf_counter() - t0)

    def renewed(self, ttl: int) -> None:
        """etcd answered a keep-alive (from the channel's stream reader)."""
        stats, landed = self.host.stats, time.time()
        if not self.alive or self.silent:
            return
        if ttl <= 0:
            stats.lease_lost.append(self.name)
            self._spawn(self.exit("lease expired", revoke=True))
            return
        self.last_keepalive_sent = self.keepalive_sent_at
        stats.beats += 1
        stats.keepalive_s.append(landed - self.keepalive_sent_at)
        if self.last_landed is not None:
            stats.gaps.append(landed - self.last_landed)
        self.last_landed = landed

    def _on_catalog(self, event: Any) -> None:
        if event.type == kv_pb2.Event.PUT and self.alive and not self.silent and self.standby:
            self._spawn(self._standby_round())

    async def _standby_round(self) -> None:
        """The standby duty's round (stalwart.agents.standby): the job state, a slot node's heartbeat
        (the loader state) and the running generation's assignment (the memory stores)."""
        job = self.host.job
        try:
            reply = await self._range("range job state (standby)", keys.job_state(job))
            if not reply.kvs:
                return
            generation, first_slot = self.host.generation_and_first_slot(reply.kvs[0])
            if first_slot is not None:
                await self._range("range heartbeat (standby)", keys.node_heartbeat(job, first_slot))
            if generation:
                await self._range("range assignment (standby)", keys.generation(job, generation))
        except grpc.aio.AioRpcError:
            pass  # the agent logs "standby round skipped" and tries again a second later


class NodeHost:
    """The simulator process: its nodes, their shared channels, the control socket."""

    def __init__(self, args: argparse.Namespace, spec: TrainingJob) -> None:
        self.endpoint: str = args.etcd
        self.job: str = args.job
        self.nodes_per_channel: int = args.nodes_per_channel
        self.step_time: float = args.step_time
        self.first_step_after: float = args.first_step_after
        self.stack_seconds: float = args.stack_seconds
        ft = spec.spec.fault_tolerance
        self.interval, self.ttl = ft.heartbeat_interval_seconds, ft.lease_ttl_seconds
        self.progress_interval = job_progress_interval(spec.spec)
        self.memory = spec.spec.checkpoint.memory
        self.mirror = self.memory and spec.spec.standbys.preload_checkpoint
        self.wheel: list[list[SimNode]] = [[] for _ in range(WHEEL_SLOTS)]
        self.urgent: list[SimNode] = []  # nodes to beat at the next slot (a command changed them)
        self.checkpoint_interval = spec.spec.checkpoint.interval_steps
        self.nodes: dict[str, SimNode] = {}
        self.conns: list[Conn] = []
        self.stats = Stats()
        self.stack_texts = _stack_texts()
        self.culprit: str | None = None
        # Parsed once per (key, revision) for the whole process: every node reads the same bytes.
        self._parsed: dict[tuple[str, bytes, int], Any] = {}
        self._stop = asyncio.Event()
        self.bulk_reads = asyncio.Semaphore(args.bulk_reads)
        self.start_rate: float = args.start_rate
        self._starting: asyncio.Queue[SimNode] = asyncio.Queue()
        self.recent_lag: deque[float] = deque(maxlen=50)  # the last 5 s

    def _cached(self, kv: Any, build: Callable[[bytes], Any], what: str = "") -> Any:
        ident = (what, kv.key, kv.mod_revision)
        if ident not in self._parsed:
            if len(self._parsed) > 64:
                self._parsed.clear()
            self._parsed[ident] = build(kv.value)
        return self._parsed[ident]

    def parsed_spec(self, kv: Any) -> TrainingJob:
        return self._cached(kv, lambda raw: parse_job(json.loads(raw), "spec"))

    def assignment_for(self, kv: Any, node: str) -> NodeAssignment | None:
        by_node = self._cached(kv, lambda raw: {n.node: n for n in Assignment.loads(raw).nodes})
        return by_node.get(node)

    def standbys(self, kv: Any) -> set[str]:
        return self._cached(kv, lambda raw: set(JobState.loads(raw).standbys))

    def generation_and_first_slot(self, kv: Any) -> tuple[int, str | None]:
        def parse(raw: bytes) -> tuple[int, str | None]:
            state = JobState.loads(raw)
            return state.generation, state.slots[0] if state.slots else None

        return self._cached(kv, parse, "generation")

    def wheel_add(self, node: SimNode) -> None:
        """Agents that registered together do not beat in step for long: a random slot each."""
        self.wheel[random.randrange(WHEEL_SLOTS)].append(node)

    async def _turn_wheel(self) -> None:
        """Every node beats once a turn, from its slot; a node a command changed, at the next slot."""
        period = self.interval / WHEEL_SLOTS
        slot, due = 0, time.perf_counter()
        while True:
            due += period
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -self.interval:
                due = time.perf_counter()  # a whole turn behind: beat on from now, do not race to catch up
            now = time.time()
            urgent, self.urgent = self.urgent, []
            live = [n for n in self.wheel[slot] if n.alive and not n.silent]
            self.wheel[slot] = live
            slot = (slot + 1) % WHEEL_SLOTS
            renewals: dict[Conn, list[int]] = {}
            for node in [*live, *(n for n in urgent if n.alive and not n.silent)]:
                if node.beat(now):
                    renewals.setdefault(node.conn, []).append(node.lease_id)
            for conn, lease_ids in renewals.items():
                try:
                    await conn.keep_alive(lease_ids)
                except OSError as exc:  # etcd refused the connection: the nodes try again next turn
                    self.stats.beat_errors[type(exc).__name__] += len(lease_ids)
                    continue
                self.stats.calls["lease keepalive (stream)"] += len(lease_ids)

    def _conn(self) -> Conn:
        if not self.conns or self.conns[-1].users >= self.nodes_per_channel:
            self.conns.append(Conn(self.endpoint))
        conn = self.conns[-1]
        conn.users += 1
        return conn

    # -- the control socket ----------------------------------------------------------------------
    async def op_start(self, node: str) -> dict[str, Any]:
        """Like creating a pod: it is listed (alive) at once and its agent starts a moment later,
        at most `start_rate` a second per process (the rate at which machines come up)."""
        current = self.nodes.get(node)
        if current is not None and current.alive:
            return {}
        sim = SimNode(self, node, self._conn())
        self.nodes[node] = sim
        self._starting.put_nowait(sim)
        return {}

    async def _start_nodes(self) -> None:
        while True:
            sim = await self._starting.get()
            if sim.alive and self.nodes.get(sim.name) is sim:
                sim.start()
                await asyncio.sleep(1.0 / self.start_rate)

    async def op_stop(self, node: str) -> dict[str, Any]:
        sim = self.nodes.pop(node, None)
        if sim is not None:
            await sim.exit("stopped", revoke=True)
        return {}

    async def op_list(self) -> dict[str, Any]:
        return {"nodes": [[n.name, n.alive] for n in self.nodes.values()]}

    async def op_kill(self, node: str, exited: bool = False) -> dict[str, Any]:
        sim = self.nodes.get(node)
        if sim is None:
            raise KeyError(f"no node {node!r} here")
        return await sim.kill(exited)

    async def op_freeze(self, culprit: str | None = None) -> dict[str, Any]:
        """Every running node's progress stops now (a hang: one rank stuck, the others waiting for
        it in a collective); `culprit`'s stacks show the stuck rank."""
        now = time.time()
        self.culprit = culprit
        last = []
        for sim in self.nodes.values():
            if sim.running and sim.alive and not sim.silent:
                sim.frozen_at = now
                sim._advance_workers(now)
                last += [w.last_progress_at for w in sim.workers if w.last_progress_at is not None]
        return {"frozen_at": now, "last_progress_at": max(last, default=None)}

    async def op_summary(self) -> dict[str, Any]:
        nodes = list(self.nodes.values())
        return {
            "nodes": len(nodes),
            "alive": sum(n.alive for n in nodes),
            "registered": sum(n.registered_at is not None and n.alive for n in nodes),
            "running": sum(n.running and n.alive for n in nodes),
            "stepping": sum(n.running and n.alive and bool(n.workers) and n.workers[0].step is not None for n in nodes),
            "generations": dict(Counter(str(n.generation) for n in nodes if n.running and n.alive)),
            "channels": len(self.conns),
            "loop_lag_recent_max_s": max(list(self.recent_lag), default=0.0),
            "exits": dict(self.stats.exits),
            "read_timeouts": dict(self.stats.read_timeouts),
        }

    async def op_stats(self, reset: bool = False) -> dict[str, Any]:
        out = self.stats.snapshot(self.interval)
        out["nodes"] = len(self.nodes)
        out["progress_interval_s"] = self.progress_interval
        out["keepalive_streams_opened"] = sum(c.streams_opened for c in self.conns)
        live = sum(n.alive and not n.silent and n.registered_at is not None for n in self.nodes.values())
        out["cpu_ms_per_node_second"] = 1000 * out["cpu_seconds"] / (live * out["seconds"]) if live else None
        if reset:
            self.stats.reset()
        return out

    async def op_shutdown(self) -> dict[str, Any]:
        self._stop.set()
        return {}

    async def _serve_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                request = json.loads(line)
                op = request.pop("op")
                try:
                    reply = await getattr(self, f"op_{op}")(**request)
                except Exception as exc:  # a bad request is answered, never fatal
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _watch_loop_lag(self) -> None:
        period = 0.1
        while True:
            start = time.perf_counter()
            await asyncio.sleep(period)
            lag = time.perf_counter() - start - period
            self.stats.loop_lag_s.append(lag)
            self.recent_lag.append(lag)

    async def run(self, socket_path: str) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        server = await asyncio.start_unix_server(self._serve_client, socket_path)
        helpers = [
            asyncio.create_task(self._watch_loop_lag()),
            asyncio.create_task(self._start_nodes()),
            asyncio.create_task(self._turn_wheel()),
        ]
        await self._stop.wait()
        for task in helpers:
            task.cancel()
        server.close()
        for conn in self.conns:
            await conn.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--etcd", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--nodes-per-channel", type=int, default=100)
    parser.add_argument("--step-time", type=float, default=1.0)
    parser.add_argument("--first-step-after", type=float, default=1.0)
    parser.add_argument("--stack-seconds", type=float, default=0.5)
    parser.add_argument("--bulk-reads", type=int, default=4, help="whole-prefix reads in flight at once")
    parser.add_argument("--start-rate", type=float, default=100.0, help="node agents started per second")
    args = parser.parse_args(argv)
    from stalwart.store.client import Store

    store = Store(args.etcd)
    try:
        raw = store.get_raw(keys.job_spec(args.job))
    finally:
        store.close()
    if raw is None:
        raise SystemExit(f"job {args.job!r} has no spec in etcd at {args.etcd}")
    spec = parse_job(json.loads(raw), keys.job_spec(args.job))
    asyncio.run(NodeHost(args, spec).run(args.socket))


if __name__ == "__main__":
    main()
