"""The detector interface: a plug-in that watches the job and reports what it finds.

A detector owns its history (a loss series, a pace, a NIC's flaps...) and, each tick of the stages
it watches, looks at a `View` of the observation and returns a `Report`: findings for the core to
act on, long work it wants done off the loop (a stack capture), and observation it needs this tick
(a listing of the cluster's nodes). It never writes anything: the core turns its findings into
ladder decisions (stalwart.controller.core.policy.decide) and commits them.

Contract:
- `observe` may be called more than once per tick with the same view (when the core fetches what
  some detector needs and decides again): it must be idempotent for a given view.
- A finding is reported on every tick until the core handled it: `handled` is called once the
  decision that acted on it is committed. A commit that fails loses nothing.
- The detector resets itself when the job's generation changes (`reset`).
- The result of work it asked for is `view.result(key)`, once: reading a result consumes it (when
  the tick's decision holds), so a detector keeps what it needs of it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from stalwart.cluster.base import NodeInfo
from stalwart.controller.core.decision import Needs
from stalwart.controller.core.observation import Observation
from stalwart.controller.core.policy import Classified
from stalwart.controller.core.work import Work, WorkKey, WorkResult
from stalwart.diagnosis.log_classify import SYMPTOMS
from stalwart.spec import TrainingJobSpec
from stalwart.store.heartbeat_budget import job_progress_interval
from stalwart.store.records import (
    Heartbeat,
    JobStage,
    JobState,
    NodeRegistration,
    OperatorRequest,
    WorkerStatus,
)

PEER_TROUBLE_SECONDS = 5.0  # how long a worker's peer-loss symptom makes the core list the cluster


@dataclass
class Failure:
    """A failure for the ladder: what happened (classified, with suspects and evidence) and when."""

    what: Classified
    failed_at: float
    detected_at: float | None = None  # default: the tick that handles it
    # Nodes to fence once the decision holds: node -> (its lease, why it is fenced).
    fence: dict[str, tuple[int, str]] = field(default_factory=dict)
    incident: str | None = None  # the incident the decision opened for it (set by the ladder)


@dataclass(frozen=True)
class RequestFinding:
    """An operator request to carry out (evict, cordon, uncordon, check), with its revision."""

    request: OperatorRequest
    revision: int


@dataclass(frozen=True)
class CodeUpdateSeen:
    """The spec names a new codeVersion: applied at the next restart (or at the deadline)."""

    version: str | None


@dataclass(frozen=True)
class LateVerdict:
    """Diagnosis' verdict on a failure that was handled without it (it came after the wait): the
    incident gains it, whatever the job's stage."""

    incident: str
    verdict: dict[str, Any]
    diagnosed_at: float


Finding = Failure | RequestFinding | CodeUpdateSeen | LateVerdict


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    work: list[Work] = field(default_factory=list)
    needs: Needs = field(default_factory=Needs)


@dataclass(frozen=True)
class View:
    """What detectors see: the observation, with the running generation's workers picked out."""

    obs: Observation
    state: JobState
    spec: TrainingJobSpec
    taken: set[WorkKey] = field(default_factory=set)  # results read this tick: consumed if it holds

    @classmethod
    def of(cls, obs: Observation, state: JobState) -> View:
        return cls(obs, state, obs.spec.spec)

    @property
    def now(self) -> float:
        return self.obs.now

    @property
    def registrations(self) -> Mapping[str, NodeRegistration]:
        return self.obs.registrations

    @cached_property
    def progress_interval(self) -> float:
        """How often a node's heartbeat brings new progress and metrics (its heartbeat interval,
        longer for a big job: stalwart.store.heartbeat_budget). Changes the controller acts on
        (exits, failures, log matches, a first step) come at once whatever the job's size."""
        return job_progress_interval(self.spec)

    @property
    def progress_lag(self) -> float:
        """How much later than a heartbeat interval a node's progress may be seen (0 for a job
        small enough to write every beat)."""
        return self.progress_interval - self.spec.fault_tolerance.heartbeat_interval_seconds

    @property
    def beats(self) -> Mapping[str, Heartbeat]:
        return self.obs.beats

    @property
    def cluster(self) -> Mapping[str, NodeInfo] | None:
        return self.obs.cluster

    @property
    def vectors(self) -> Mapping[str, Sequence[Mapping[str, Any]]]:
        return self.obs.vectors

    @cached_property
    def workers(self) -> list[WorkerStatus]:
        """The current generation's workers on the slot nodes, as their last heartbeats say."""
        return self.state.current_workers(self.obs.beats)

    @cached_property
    def owners(self) -> dict[int, str]:
        """Rank -> the slot node whose heartbeat reports it."""
        return {w.rank: n for n in self.state.slots if (b := self.obs.beats.get(n)) for w in b.workers}

    def crashed(self) -> list[WorkerStatus]:
        """Workers that exited non-zero, the likely root first: those that died of a symptom of
        another rank's failure (a peer's closed socket, a collective timeout) after the rest, each
        group in exit order. Exit order alone misleads: gloo peers die within milliseconds of the
        killed rank, and their agents may see them first (an earlier poll, or the same poll in
        local-rank order)."""
        failed = (w for w in self.workers if w.exit_code not in (None, 0))
        return sorted(failed, key=lambda w: (w.failure_class in SYMPTOMS, w.exited_at or 0))

    def first_exit(self) -> float | None:
        """When the first of the crashed workers exited (a victim may have gone before its root)."""
        return min((w.exited_at or self.now for w in self.crashed()), default=None)

    def lost(self) -> list[str]:
        """Slot nodes whose lease lapsed (no registration)."""
        return [n for n in self.state.slots if n not in self.obs.registrations]

    def silent_since(self, t: float) -> list[str]:
        """Slot nodes with no heartbeat sent after `t`. Agents beat at once when a worker exits,
        and every interval otherwise, so a live node is heard from soon after any crash."""
        return [n for n in self.state.slots if (b := self.obs.beats.get(n)) is None or b.sent_at < t]

    def peer_trouble(self) -> bool:
        """A worker reported, in the last few seconds, a symptom of another rank's failure (its
        peer's socket closed, a collective timed out): the first sign of a dead machine."""
        return any(
            m.failure_class in SYMPTOMS and self.now - m.matched_at < PEER_TROUBLE_SECONDS
            for w in self.workers
            for m in w.matches
        )

    def slot_vectors(self) -> dict[str, list[Mapping[str, Any]]]:
        """A copy of the slot nodes' metric windows, for work that runs off the loop."""
        return {n: list(self.obs.vectors.get(n, ())) for n in self.state.slots}

    def result(self, key: WorkKey) -> WorkResult | None:
        """The result of a piece of work, if it came back; read, it is consumed with this decision."""
        found = self.obs.results.get(key)
        if found is not None:
            self.taken.add(key)
        return found

    def busy(self, key: WorkKey) -> bool:
        """The work is running, or its result waits to be used."""
        return key in self.obs.in_flight or key in self.obs.results


class Detector(ABC):
    """Subclass, give it a `name`, list it in stalwart.controller.core.detectors.DETECTORS."""

    name: ClassVar[str]
    stages: ClassVar[frozenset[JobStage]] = frozenset({JobStage.RUNNING})

    def __init__(self) -> None:
        self._generation: int | None = None

    def look(self, view: View) -> Report:
        if view.state.generation != self._generation:
            self._generation = view.state.generation
            self.reset()
        return self.observe(view)

    @abstractmethod
    def observe(self, view: View) -> Report:
        """What this detector finds now."""

    def reset(self) -> None:
        """A new generation started: forget what watched the old one."""

    def handled(self, finding: Finding, now: float) -> None:
        """The core committed a decision on `finding` (whatever the rung, Ignore included)."""
