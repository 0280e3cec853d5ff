"""Reading a tick's observation: the job's records in etcd, the cluster's nodes when they matter,
and the results of long work that finished. The core only ever sees the `Observation`
(stalwart.controller.core.observation) the `Observer` builds.

A tick reads the job's state (its revision guards the commit), its spec, and the open incident; the
nodes, the operator requests and the checkpoint catalog come from the controller's watches (the
`JobView` below), so a tick costs what changed since the last one, not the job's size.

The controller's view of a job's nodes, operator requests and checkpoint catalog, fed by watches.

Reading the job's nodes prefix every tick costs O(N) (tens of MB at 10,000 nodes, over the
client's 4 MiB reply) and one Range per slot to know which commands to write did as much again.
Instead, one watch per prefix (stalwart.store.prefix_mirror) keeps an in-memory copy, and a tick
parses only the records that changed since the last one:

    nodes/        registrations (a lapsed lease deletes its node's: the next tick sees it lost),
                  heartbeats (the last one of a node is kept after its lease lapsed), commands
    requests/     operator requests (the oldest pending one is read again, with its revision,
                  to guard the commit that answers it)
    checkpoints/  the catalog

A command the controller writes is noted here as soon as etcd acknowledges it (with the write's
revision), so the next tick compares what it wants with what it wrote, without reading it back and
without writing it again. The view is read at the controller's start, and again whenever etcd has
compacted the changes a broken watch missed (prefix_mirror.py); the Observation it gives the core
is the same as a full read of those prefixes would give.

The view also says when a tick is worth running (`notice(trouble)`, called on the watches' threads):
a node registered or lost its lease, a heartbeat changed in what moves the job's stage
(`heartbeat_budget.urgent`: the generation, the agent's state, a worker started, exited or matched
a log signature, a machine fault), or an operator request came. `trouble` says whether it looks like
a failure unfolding (a lease lost, `heartbeat_budget.trouble`: an exit, a log signature, a machine
fault): the controller then watches closely for a
while. Progress (step, loss, metrics) and saved checkpoints are no notice: the controller's timed
tick reads them, as fresh as the watch has them, so a job that trains quietly costs the controller
a tick per IDLE_TICK_SECONDS, not one per heartbeat (at 1,000 nodes saving every 10 s, a save
arrives every 10 ms). Commands (the controller's own writes, echoed back) and the catalog are none
either.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from stalwart.cluster import Cluster
from stalwart.controller.core.decision import Needs
from stalwart.controller.core.observation import BeatChanges, Observation
from stalwart.controller.core.work import WorkKey, WorkResult
from stalwart.controller.shell.clock import Clock
from stalwart.logs import ContextLogger
from stalwart.spec import TrainingJob
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.heartbeat_budget import trouble, urgent
from stalwart.store.jobs import parse_spec
from stalwart.store.prefix_mirror import PrefixMirror
from stalwart.store.records import (
    AgentCommand,
    CheckpointEntry,
    DataPlaneHealth,
    Heartbeat,
    Incident,
    JobStage,
    JobState,
    NodeRegistration,
    OperatorRequest,
    Record,
    RequestStatus,
)

# Stages whose every tick may start, stop or replace nodes: they list the cluster every tick.
# (Running and Suspended list it once per heartbeat interval, and when the core asks.)
VECTOR_WINDOW = 120  # heartbeat metric vectors kept per node
CHANGE_LOG_KEPT = 200_000  # heartbeat changes remembered (a detector further behind redoes every node)

LISTED_EVERY_TICK = frozenset(
    {
        JobStage.STARTING,
        JobStage.PREFLIGHT,
        JobStage.RESTARTING,
        JobStage.CHECKING,
        JobStage.REPLAY_HORIZONTAL,
        JobStage.REPLAY_VERTICAL,
        JobStage.SUSPENDING,
    }
)


class Observer:
    """Reads an observation. Keeps the job's nodes, requests and catalog by watch (`view`, which
    also keeps the last heartbeat of every node: a lapsed lease takes the heartbeat key with it),
    and the parsed spec (parsed again only when it changes)."""

    def __init__(
        self,
        store: Store,
        cluster: Cluster,
        job: str,
        clock: Clock,
        log: ContextLogger,
        notice: Callable[[bool], None] | None = None,
    ) -> None:
        """`notice(trouble)`: called (on a watch's thread) when something the controller acts on at
        once arrives (`JobView`, below)."""
        self.store, self.cluster, self.job, self.clock, self.log = store, cluster, job, clock, log
        self.view = JobView(store, job, log, notice)
        self._vectors: dict[str, deque[dict[str, Any]]] = {}
        self._spec: tuple[bytes, TrainingJob] | None = None
        self._listed_at = -math.inf

    def spec(self) -> TrainingJob:
        """The job's spec; a spec that no longer parses is reported and the last good one kept."""
        key = keys.job_spec(self.job)
        raw = self.store.get_raw(key)
        if raw is None:
            if self._spec is None:
                raise ValueError(f"job {self.job!r} not found in etcd ({key})")
            return self._spec[1]
        if self._spec is None or self._spec[0] != raw:
            try:
                self._spec = (raw, parse_spec(raw, self.job))
            except ValueError as exc:
                if self._spec is None:
                    raise
                self.log.error(
                    "the job's spec in etcd is invalid; keeping the last good one", fields={"error": str(exc)}
                )
                self._spec = (raw, self._spec[1])
        return self._spec[1]

    def observe(self, results: Mapping[WorkKey, WorkResult], in_flight: frozenset[WorkKey]) -> Observation:
        now = self.clock.time()
        state, revision = self.store.get_with_revision(keys.job_state(self.job), JobState)
        spec = self.spec()
        view = self.view
        self._keep_vectors(view.refresh())
        incident = None
        if state is not None and state.open_incident is not None:
            incident = self.store.get(keys.incident(self.job, state.open_incident), Incident)
        obs = Observation(
            now=now,
            state=state,
            revision=revision,
            spec=spec,
            registrations=dict(view.registrations),
            beats=dict(view.last_beats),
            commands=dict(view.commands),
            vectors=self._vectors,  # read-only to the core; work that runs off the loop copies what it needs
            request=self._oldest_request() if state is not None and not state.stage.terminal else None,
            incident=incident,
            results=dict(results),
            in_flight=in_flight,
            catalog=view.checkpoints() if state is not None and not state.stage.terminal else {},
            dataplane=self.store.get(keys.dataplane_health(self.job), DataPlaneHealth)
            if spec.spec.data_plane is not None
            else None,
            beat_changes=view.beat_changes(),
        )
        interval = spec.spec.fault_tolerance.heartbeat_interval_seconds
        if state is not None and (state.stage in LISTED_EVERY_TICK or now - self._listed_at >= interval):
            obs = self.complete(obs, Needs(cluster=True))
        return obs

    def close(self) -> None:
        self.view.close()

    def _keep_vectors(self, beats: Sequence[Heartbeat]) -> None:
        """Each heartbeat that arrived adds its metric vector to its node's window."""
        for beat in beats:
            window = self._vectors.setdefault(beat.node, deque(maxlen=VECTOR_WINDOW))
            if beat.vector and (not window or window[-1].get("at") != beat.vector.get("at")):
                window.append(beat.vector)

    def complete(self, obs: Observation, needs: Needs) -> Observation:
        """`obs` with what `needs` asks for added."""
        cluster, free = obs.cluster, obs.free_machines
        if needs.cluster and cluster is None:
            cluster = {n.name: n for n in self.cluster.list_nodes()}
            free = self.cluster.free_machines()
            self._listed_at = obs.now
        rendezvous = dict(obs.rendezvous)
        for node in sorted(needs.rendezvous - set(rendezvous)):
            rendezvous[node] = self.cluster.rendezvous(node)
        incidents = dict(obs.incidents)
        for incident in sorted(needs.incidents - set(incidents)):
            incidents[incident] = self.store.get(keys.incident(self.job, incident), Incident)
        return replace(obs, cluster=cluster, free_machines=free, rendezvous=rendezvous, incidents=incidents)

    def _oldest_request(self) -> tuple[OperatorRequest, int] | None:
        """The oldest pending request, re-read with its revision (its commit is guarded by it)."""
        pending = self.view.pending_requests()
        if not pending:
            return None
        oldest = min(pending, key=lambda r: r.requested_at)
        request, revision = self.store.get_with_revision(keys.request(self.job, oldest.id), OperatorRequest)
        if request is None or request.status is not RequestStatus.PENDING:
            return None  # withdrawn or done since the listing
        return request, revision


# -- the job's view, fed by watches ----------------------------------------------------------------------

R = TypeVar("R", bound=Record)


class JobView:
    def __init__(
        self, store: Store, job: str, log: ContextLogger, notice: Callable[[bool], None] | None = None
    ) -> None:
        """`notice(trouble)`: something the controller acts on at once arrived (module docstring)."""
        self.job, self.log = job, log
        self._notice = notice
        # Per node, what its last heartbeat said; the nodes watch's thread alone uses them.
        self._urgent: dict[str, tuple[Any, ...]] = {}
        self._trouble: dict[str, tuple[Any, ...]] = {}
        self._parsed_beats: dict[str, tuple[bytes, Heartbeat]] = {}  # read by the tick: parsed once
        self.nodes = PrefixMirror(store, keys.nodes_prefix(job), self._on_node_change if notice else None)
        self.requests_mirror = PrefixMirror(
            store, keys.requests_prefix(job), (lambda _key, _value: notice(False)) if notice else None
        )
        self.checkpoints_mirror = PrefixMirror(store, keys.checkpoints_prefix(job))
        self.registrations: dict[str, NodeRegistration] = {}
        self.heartbeats: dict[str, Heartbeat] = {}  # nodes whose heartbeat key exists now
        self.last_beats: dict[str, Heartbeat] = {}  # every node's last heartbeat, lapsed leases included
        self.commands: dict[str, AgentCommand] = {}
        self.requests: dict[str, OperatorRequest] = {}  # by key
        self.catalog: dict[str, CheckpointEntry] = {}  # by key
        # The nodes whose heartbeat changed, in order (core.observation.BeatChanges): detectors redo
        # only those. Its oldest half goes when it grows past CHANGE_LOG_KEPT.
        self._changes: list[str] = []
        self._changes_start = 0

    def start(self) -> None:
        """Read the prefixes (paged) and watch them; idempotent; raises StoreUnavailable."""
        for mirror in (self.nodes, self.requests_mirror, self.checkpoints_mirror):
            mirror.start()

    def close(self) -> None:
        for mirror in (self.nodes, self.requests_mirror, self.checkpoints_mirror):
            mirror.close()

    def refresh(self) -> list[Heartbeat]:
        """Apply what changed since the last call; returns the heartbeats that arrived."""
        self.start()
        beats: list[Heartbeat] = []
        for key, raw in self.nodes.take().items():
            parsed = keys.parse_node_key(self.job, key)
            if parsed is None:
                continue
            node, leaf = parsed
            if leaf == "registration":
                self._apply(self.registrations, node, key, raw, NodeRegistration)
            elif leaf == "heartbeat":
                parsed_by_watch = self._parsed_beats.get(node)
                beat: Heartbeat | None
                if raw is not None and parsed_by_watch is not None and parsed_by_watch[0] is raw:
                    beat = self.heartbeats[node] = parsed_by_watch[1]  # the watch parsed this very value
                else:
                    beat = self._apply(self.heartbeats, node, key, raw, Heartbeat)
                if beat is not None:
                    self.last_beats[node] = beat
                    beats.append(beat)
                    self._changes.append(node)
            elif leaf == "command":
                self._apply(self.commands, node, key, raw, AgentCommand)
        for key, raw in self.requests_mirror.take().items():
            self._apply(self.requests, key, key, raw, OperatorRequest)
        for key, raw in self.checkpoints_mirror.take().items():
            self._apply(self.catalog, key, key, raw, CheckpointEntry)
        return beats

    def beat_changes(self) -> BeatChanges:
        """The change log as the next observation carries it."""
        if len(self._changes) > CHANGE_LOG_KEPT:
            dropped = len(self._changes) // 2
            self._changes = self._changes[dropped:]  # a new list: past observations keep theirs
            self._changes_start += dropped
        return BeatChanges(self._changes, self._changes_start, self._changes_start + len(self._changes))

    def _on_node_change(self, key: str, raw: bytes | None) -> None:
        assert self._notice is not None
        parsed = keys.parse_node_key(self.job, key)
        if parsed is None or parsed[1] == "command":
            return
        node, leaf = parsed
        if leaf != "heartbeat" or raw is None:
            if leaf == "heartbeat":
                self._parsed_beats.pop(node, None)  # its lease lapsed: no value left to reuse
            self._notice(raw is None)  # a node joined, or lost its lease
            return
        try:
            beat = Heartbeat.loads(raw)
        except ValueError:
            self._notice(False)  # the tick says what is wrong with it
            return
        self._parsed_beats[node] = (raw, beat)
        now, signs = urgent(beat), trouble(beat)
        if self._urgent.get(node) != now:
            self._notice(self._trouble.get(node, signs) != signs)
        self._urgent[node], self._trouble[node] = now, signs

    def wrote_command(self, node: str, command: AgentCommand, revision: int) -> None:
        """The controller wrote `command` (etcd acknowledged it at `revision`)."""
        self.nodes.note(keys.node_command(self.job, node), command.dumps().encode(), revision)

    def pending_requests(self) -> list[OperatorRequest]:
        return [r for r in self.requests.values() if r.status is RequestStatus.PENDING]

    def checkpoints(self) -> dict[int, CheckpointEntry]:
        return {e.step: e for e in self.catalog.values()}

    def _apply(self, into: dict[str, R], name: str, key: str, raw: bytes | None, cls: type[R]) -> R | None:
        if raw is None:
            into.pop(name, None)
            return None
        try:
            record: R = cls.loads(raw)
        except ValueError as exc:
            # A record that does not parse is left out (as if absent), and said once per write.
            self.log.error("unreadable record in etcd; ignored", fields={"key": key, "error": str(exc)[:300]})
            into.pop(name, None)
            return None
        into[name] = record
        return record
