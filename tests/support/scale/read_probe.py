"""What one controller tick's reads, one CLI listing and one generation start cost at N nodes.

etcd is seeded with N nodes' records as the agents write them (registration, a heartbeat with every
worker stepping, the RUN command) and a job state holding N slots; then each read or write is run
as the product runs it (the same functions: stalwart.store.nodes.read_nodes, the controller's
observation and decision, `stalwart jobs`' read_jobs, the generation commit, an eviction's commit,
the stack collection) and timed, wall and CPU, with no simulator load beside it. On a shared
machine this is the steadiest figure the harness has: one thread, a few seconds, repeated.

Limits found on the way (the client's 4 MiB reply, etcd's 1.5 MiB request and 128 operations per
transaction, the diagnosis topology's rank bound) are reported as the error the product would meet,
not worked around. A design older than the watch-fed controller (issue 23) checked every slot's
command with a Range each tick: `command_check_per_slot` times that, for comparison.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import pyetcd

from stalwart.cluster import Cluster, NodeInfo
from stalwart.controller.core.decision import Needs
from stalwart.controller.core.detectors import default_detectors
from stalwart.controller.core.ranks import assign
from stalwart.controller.core.reconcile import ReconcileCore
from stalwart.controller.shell.clock import SystemClock
from stalwart.controller.shell.diagnosis import collect_stacks
from stalwart.controller.shell.loop import IDLE_TICK_SECONDS, commit_chunks
from stalwart.controller.shell.observer import Observer
from stalwart.logs import get_logger
from stalwart.processes import wait_for
from stalwart.spec import TrainingJob
from stalwart.store import Store, keys
from stalwart.store.heartbeat_budget import job_progress_interval
from stalwart.store.nodes import read_nodes
from stalwart.store.records import (
    AgentAction,
    AgentCommand,
    Cordon,
    Heartbeat,
    JobPhase,
    JobState,
    NodeRegistration,
    StackReport,
)
from support.scale.simnodes import (
    _stack_texts,
    advance_workers,
    heartbeat_record,
    registration_record,
    running_workers,
)

GRPC_REPLY_LIMIT = 4 * 1024 * 1024  # grpc's default max_receive_message_length: the product's clients
SEED_BATCH = 120  # puts per transaction (etcd refuses more than 128 operations in one)
EVICTED_AT_ONCE = 300  # an eviction this big needs more than one transaction (a rack, a mass lease loss)


class _Listed(Cluster):
    """The cluster as the controller lists it: every node alive (nothing else is asked here)."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes

    def start_node(self, name: str, role: str | None = None) -> None:
        raise NotImplementedError

    def stop_node(self, name: str) -> None:
        raise NotImplementedError

    def list_nodes(self) -> list[NodeInfo]:
        return [NodeInfo(name=n, alive=True) for n in self.nodes]

    def rendezvous(self, node: str) -> tuple[str, int]:
        return "127.0.0.1", 29500


class _Calls:
    """Counts the etcd calls a store makes (every call goes through Store._call)."""

    def __init__(self, store: Store) -> None:
        self.store, self.count, self._inner = store, 0, store._call

    def __enter__(self) -> _Calls:
        def counted(fn: Callable[[], Any]) -> Any:
            self.count += 1
            return self._inner(fn)

        self.store._call = counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.store._call = self._inner  # type: ignore[method-assign]


def _timed(fn: Callable[[], Any], repeats: int) -> dict[str, Any]:
    walls, cpus, error, value = [], [], None, None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            value = fn()
        except Exception as exc:  # the error the product would meet is the finding
            error = f"{type(exc).__name__}: {exc}"[:300]
            break
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    out: dict[str, Any] = {"ok": error is None}
    if walls:
        out.update(wall_s=round(statistics.median(walls), 4), cpu_s=round(statistics.median(cpus), 4))
    if error:
        out["error"] = error
    if isinstance(value, dict):
        out.update(value)
    return out


def _tick_after_beats(
    store: Store, job: TrainingJob, state: JobState, observer: Observer, tick: Callable[[], Any], repeats: int
) -> dict[str, Any]:
    """A running job's tick: the heartbeats that arrive between two idle ticks (nodes x the idle
    tick over the progress interval: a quarter of the nodes at 1,000, 1/40 at 10,000) are written
    and reach the controller's view first, then one observation and decision is timed. What the
    detectors' digests save shows here: only those nodes are looked at again."""
    name, procs = job.metadata.name, job.spec.roles[0].processes_per_node
    per_tick = max(1, math.ceil(len(state.slots) * IDLE_TICK_SECONDS / job_progress_interval(job.spec)))
    walls: list[float] = []
    cpus: list[float] = []
    cursor = 0
    for _ in range(repeats):
        now = time.time()
        batch: dict[str, Any] = {}
        for _ in range(per_tick):
            i, cursor = cursor, (cursor + 1) % len(state.slots)
            workers = running_workers(i * procs, procs, now - 120, state.slots[i])
            advance_workers(workers, now - 120, now, first_step_after=1.0, step_time=1.0, checkpoint_interval=100)
            batch[keys.node_heartbeat(name, state.slots[i])] = heartbeat_record(
                state.slots[i], state.generation, workers, now
            )
            if len(batch) >= SEED_BATCH:
                store.commit(batch)
                batch = {}
        if batch:
            store.commit(batch)
        events = observer.view.nodes.events
        target = events + per_tick
        if not wait_for(lambda target=target: observer.view.nodes.events >= target, timeout=60.0, interval=0.01):
            got = observer.view.nodes.events - events
            return {
                "ok": False,
                "beats_per_tick": per_tick,
                "error": f"the view saw {got} of the {per_tick} heartbeats written in 60 s",
            }
        w0, c0 = time.perf_counter(), time.process_time()
        tick()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {
        "ok": True,
        "beats_per_tick": per_tick,
        "wall_s": round(statistics.median(walls), 4),
        "cpu_s": round(statistics.median(cpus), 4),
        "wall_max_s": round(max(walls), 4),
    }


def seed(store: Store, job: TrainingJob, nodes: int, generation: int = 1) -> JobState:
    """N nodes mid-step in `generation`, and the job state that holds them."""
    name, procs = job.metadata.name, job.spec.roles[0].processes_per_node
    now = time.time()
    memory = job.spec.checkpoint.memory
    batch: dict[str, Any] = {}
    for i in range(nodes):
        node = f"node-{i}"
        workers = running_workers(i * procs, procs, now - 120, node)
        advance_workers(
            workers,
            now - 120,
            now,
            first_step_after=1.0,
            step_time=1.0,
            checkpoint_interval=job.spec.checkpoint.interval_steps,
        )
        batch[keys.node_registration(name, node)] = registration_record(node, name, 0x7A3F00000000 + i, i, memory)
        batch[keys.node_heartbeat(name, node)] = heartbeat_record(node, generation, workers, now)
        batch[keys.node_command(name, node)] = AgentCommand(
            generation=generation, action=AgentAction.RUN, issued_at=now
        )
        if len(batch) >= SEED_BATCH:
            store.commit(batch)
            batch = {}
    if batch:
        store.commit(batch)
    state = JobState(
        job=name,
        phase=JobPhase.RUNNING,
        generation=generation,
        slots=[f"node-{i}" for i in range(nodes)],
        standbys=[f"node-{nodes + i}" for i in range(4)],
        next_node_index=nodes + 4,
        created_at=now,
        updated_at=now,
    )
    store.put(keys.job_state(name), state)
    store.put(
        keys.generation(name, generation),
        assign(name, job.spec, state.slots, generation, ("127.0.0.1", 29500), created_at=time.time()),
    )
    return state


def probe(store: Store, job: TrainingJob, nodes: int, repeats: int = 3) -> dict[str, Any]:
    """Seed, measure, clean up. Every figure is for one call as the product makes it."""
    name = job.metadata.name
    procs = job.spec.roles[0].processes_per_node
    t0 = time.perf_counter()
    state = seed(store, job, nodes)
    out: dict[str, Any] = {"seed_s": round(time.perf_counter() - t0, 2)}
    host, _, port = store.endpoint.rpartition(":")
    # A client without the 4 MiB reply limit: what etcd would have to serve if the limit were raised.
    wide = pyetcd.client(
        host=host, port=int(port), timeout=60, grpc_options=[("grpc.max_receive_message_length", 1 << 30)]
    )
    try:

        def prefix_bytes() -> dict[str, Any]:
            items = list(wide.get_prefix(keys.nodes_prefix(name)))
            size = sum(len(v) + len(m.key) for v, m in items)
            return {"keys": len(items), "bytes": size, "over_reply_limit": size > GRPC_REPLY_LIMIT}

        out["nodes_prefix_read_unbounded"] = _timed(prefix_bytes, repeats)

        def read_nodes_unbounded() -> dict[str, Any]:
            # read_nodes' own parsing, over a reply the 4 MiB limit would have refused.
            heartbeats = 0
            for value, meta in wide.get_prefix(keys.nodes_prefix(name)):
                parsed = keys.parse_node_key(name, meta.key.decode())
                if parsed and parsed[1] == "registration":
                    NodeRegistration.loads(value)
                elif parsed and parsed[1] == "heartbeat":
                    Heartbeat.loads(value)
                    heartbeats += 1
            return {"heartbeats": heartbeats}

        out["read_nodes_without_reply_limit"] = _timed(read_nodes_unbounded, repeats)
        out["read_nodes"] = _timed(lambda: {"nodes": len(read_nodes(store, name).heartbeats)}, repeats)
        out["nodes_prefix_keys_only"] = _timed(lambda: {"keys": len(store.list_keys(keys.nodes_prefix(name)))}, 1)

        def command_checks() -> None:
            for node in state.slots:
                store.get(keys.node_command(name, node), AgentCommand)

        out["command_check_per_slot"] = _timed(command_checks, 1)
        observer = Observer(store, _Listed(state.slots), name, SystemClock(), get_logger("probe", job=name))
        core = ReconcileCore(name, default_detectors())

        def view_start() -> dict[str, Any]:
            observer.view.start()
            return {"nodes": len(observer.observe({}, frozenset()).registrations)}

        try:
            out["controller_view_start"] = _timed(view_start, 1)

            def tick() -> dict[str, Any]:
                # One tick's observation and decision (no commit, no effects), nothing changed since
                # the last: what a tick costs in steady state, and the etcd calls it makes.
                with _Calls(store) as calls:
                    obs = observer.observe({}, frozenset())
                    decision = core.decide(obs)
                    for _ in range(3):
                        if not isinstance(decision, Needs):
                            break
                        obs = observer.complete(obs, decision)
                        decision = core.decide(obs)
                return {"etcd_calls": calls.count}

            out["tick_observe_decide"] = _timed(tick, repeats)
            out["tick_after_beats"] = _tick_after_beats(store, job, state, observer, tick, repeats)
        finally:
            observer.close()
        out["job_state_bytes"] = len(state.dumps())

        def cli_jobs() -> dict[str, Any]:
            from stalwart.ops.jobs import read_jobs

            return {"jobs": len(read_jobs(store))}

        out["cli_jobs_listing"] = _timed(cli_jobs, 1)

        def generation_commit() -> dict[str, Any]:
            assignment = assign(
                name, job.spec, state.slots, state.generation + 1, ("127.0.0.1", 29500), created_at=time.time()
            )
            size = len(assignment.dumps()) + len(state.dumps())
            ok = store.commit(
                {keys.generation(name, state.generation + 1): assignment, keys.job_state(name): state},
                expect_revision={},
            )
            return {"bytes": size, "committed": ok}

        out["generation_commit"] = _timed(generation_commit, 1)
        healthy, _ = _stack_texts()
        report = StackReport(
            request_id="stk-probe",
            node="node-0",
            generation=1,
            captured_at=time.time(),
            stacks=[{"rank": r, "pid": 1, "method": "py-spy-native", "text": healthy} for r in range(procs)],
        )
        stack_bytes = nodes * (len(report.dumps()) + len(keys.stack_report(name, "stk-probe", "node-0")))
        out["stack_collection_reply_bytes"] = stack_bytes
        out["stack_collection_over_reply_limit"] = stack_bytes > GRPC_REPLY_LIMIT

        def eviction_commit() -> dict[str, Any]:
            # An eviction of many nodes at once: a cordon each, the incident, the state last.
            evicted = state.slots[: min(EVICTED_AT_ONCE, nodes)]
            puts: dict[str, Any] = {
                keys.cordon(n): Cordon(node=n, reason="probe", cordoned_at=time.time()) for n in evicted
            }
            puts[keys.job_state(name)] = state
            chunks = commit_chunks(puts, [])
            for chunk in chunks:
                assert store.commit(chunk)
                for key in chunk:
                    puts.pop(key)
            ok = store.commit(puts)
            return {"evicted": len(evicted), "transactions": len(chunks) + 1, "committed": ok}

        try:
            out["eviction_commit"] = _timed(eviction_commit, 1)
        finally:
            store.delete_prefix(keys.cordons_prefix())

        def stack_collection() -> dict[str, Any]:
            # Every node's report in etcd, then the collection as the controller runs it.
            request = "stk-probe"
            raw = report.dumps()
            batch: dict[str, str] = {}
            for node in state.slots:
                batch[keys.stack_report(name, request, node)] = raw.replace('"node-0"', f'"{node}"', 1)
                if len(batch) >= SEED_BATCH:
                    store.commit(batch)  # type: ignore[arg-type]
                    batch = {}
            if batch:
                store.commit(batch)  # type: ignore[arg-type]
            w0 = time.perf_counter()
            got = collect_stacks(store, name, request, state.slots, timeout=120.0)
            return {"reports": len(got), "collect_s": round(time.perf_counter() - w0, 3)}

        try:
            out["stack_collection"] = _timed(stack_collection, 1)
        finally:
            store.delete_prefix(keys.job_prefix(name) + "stacks/")

        def topology() -> None:
            from stalwart.diagnosis.models import Topology

            ranks = nodes * procs
            Topology(world_size=ranks, tp=1, pp=1, dp=ranks, rank_nodes={r: f"node-{r // procs}" for r in range(ranks)})

        out["hang_diagnosis_topology"] = _timed(topology, 1)
    finally:
        wide.close()
        store.delete_prefix(keys.nodes_prefix(name))
        store.delete(keys.job_state(name))
        store.delete_prefix(keys.generations_prefix(name))
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out
