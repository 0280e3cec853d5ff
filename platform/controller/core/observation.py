"""What a tick sees: the job's records in etcd, the cluster's nodes when they matter, and the results
of long work that finished. Plain data: the shell's `Observer` (stalwart.controller.shell.observer)
reads it, the core decides from it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stalwart.cluster.base import NodeInfo
from stalwart.controller.core.decision import Needs
from stalwart.controller.core.work import WorkKey, WorkResult
from stalwart.spec import TrainingJob
from stalwart.store.records import (
    AgentCommand,
    CheckpointEntry,
    DataPlaneHealth,
    Heartbeat,
    Incident,
    JobState,
    NodeRegistration,
    OperatorRequest,
)


@dataclass(frozen=True)
class BeatChanges:
    """The nodes whose heartbeat changed, in arrival order, as a log each reader follows from its own
    cursor: a detector keeps its own summary per node and redoes only the nodes that changed since it
    last looked (at 10,000 nodes, a tick's few hundred heartbeats instead of 80,000 worker records).
    The shell appends to `log` and drops its oldest part now and then (`start` moves on); a cursor
    from before `start` gets None: everything may have changed."""

    log: Sequence[str]  # node names; log[i] is change number start + i
    start: int
    end: int  # the changes this observation covers: [start, end)

    def since(self, cursor: int) -> set[str] | None:
        """The nodes changed from change number `cursor` to `end` (None: no longer known)."""
        if not self.start <= cursor <= self.end:
            return None
        return set(self.log[cursor - self.start : self.end - self.start])


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
    # With the listing: machines a node could start on now (None: no limit the cluster knows of).
    free_machines: int | None = None
    rendezvous: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    results: Mapping[WorkKey, WorkResult] = field(default_factory=dict)
    in_flight: frozenset[WorkKey] = frozenset()
    etcd_back_at: float | None = None  # when etcd last answered again after this controller lost it
    beat_changes: BeatChanges | None = None  # None: not known (every node may have changed)
    catalog: Mapping[int, CheckpointEntry] = field(default_factory=dict)  # the job's checkpoint catalog, by step
    incidents: Mapping[str, Incident | None] = field(default_factory=dict)  # read when asked for (None: gone)
    dataplane: DataPlaneHealth | None = None  # the RLHF relay's word on its workers (jobs with a dataPlane)
    # The spec as etcd holds it, when `spec` is the job's at the size its state runs (core/elastic.py).
    declared: TrainingJob | None = None

    @property
    def declared_spec(self) -> TrainingJob:
        return self.declared or self.spec

    def satisfies(self, needs: Needs) -> bool:
        return (
            (not needs.cluster or self.cluster is not None)
            and needs.rendezvous <= set(self.rendezvous)
            and needs.incidents <= set(self.incidents)
        )
