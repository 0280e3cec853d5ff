"""What a tick sees: the job's records in etcd, the cluster's nodes when they matter, and the results
of long work that finished. The `Observer` does the reading; the core only ever sees an
`Observation`.

A tick reads the job's state (its revision guards the commit), its spec, and the open incident; the
nodes, the operator requests and the checkpoint catalog come from the controller's watches
(job_view.py), so a tick costs what changed since the last one, not the job's size.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stalwart.cluster import Cluster, NodeInfo
from stalwart.controller.clock import Clock
from stalwart.controller.decision import Needs
from stalwart.controller.job_view import JobView
from stalwart.controller.work import WorkKey, WorkResult
from stalwart.logs import ContextLogger
from stalwart.spec import TrainingJob
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.jobs import parse_spec
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
    RequestStatus,
)

# Stages whose every tick may start, stop or replace nodes: they list the cluster every tick.
# (Running and Suspended list it once per heartbeat interval, and when the core asks.)
VECTOR_WINDOW = 120  # heartbeat metric vectors kept per node

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


@dataclass(frozen=True)
class Observation:
    now: float
    state: JobState | None
    revision: int  # the state's mod revision (0: no state yet)
    spec: TrainingJob  # as etcd holds it now
    registrations: Mapping[str, NodeRegistration]  # nodes whose lease is alive
    beats: Mapping[str, Heartbeat]  # each node's last heartbeat, including nodes whose lease lapsed
    commands: Mapping[str, AgentCommand]
    # Each node's recent metric vectors (NodeMetricVector dicts from its heartbeats), oldest first.
    vectors: Mapping[str, Sequence[Mapping[str, Any]]]
    request: tuple[OperatorRequest, int] | None  # the oldest pending operator request and its revision
    incident: Incident | None  # the state's open incident
    cluster: Mapping[str, NodeInfo] | None = None  # None: not listed this tick
    rendezvous: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    results: Mapping[WorkKey, WorkResult] = field(default_factory=dict)
    in_flight: frozenset[WorkKey] = frozenset()
    etcd_back_at: float | None = None  # when etcd last answered again after this controller lost it
    catalog: Mapping[int, CheckpointEntry] = field(default_factory=dict)  # the job's checkpoint catalog, by step
    incidents: Mapping[str, Incident | None] = field(default_factory=dict)  # read when asked for (None: gone)
    dataplane: DataPlaneHealth | None = None  # the RLHF relay's word on its workers (jobs with a dataPlane)

    def satisfies(self, needs: Needs) -> bool:
        return (
            (not needs.cluster or self.cluster is not None)
            and needs.rendezvous <= set(self.rendezvous)
            and needs.incidents <= set(self.incidents)
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
        once arrives (job_view.py)."""
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
        cluster = obs.cluster
        if needs.cluster and cluster is None:
            cluster = {n.name: n for n in self.cluster.list_nodes()}
            self._listed_at = obs.now
        rendezvous = dict(obs.rendezvous)
        for node in sorted(needs.rendezvous - set(rendezvous)):
            rendezvous[node] = self.cluster.rendezvous(node)
        incidents = dict(obs.incidents)
        for incident in sorted(needs.incidents - set(incidents)):
            incidents[incident] = self.store.get(keys.incident(self.job, incident), Incident)
        return replace(obs, cluster=cluster, rendezvous=rendezvous, incidents=incidents)

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
