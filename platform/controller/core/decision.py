"""What one tick decides: the state to commit, the other keys to write with it, and the effects to
carry out once the commit holds.

The core builds a `Plan` from the observation: it edits a copy of the job's state and lists puts,
deletes and effects; `Plan.decision()` freezes it. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from stalwart.controller.core.transitions import Row, Trigger, begin, enter
from stalwart.controller.core.work import Work, WorkKey
from stalwart.store.records import AgentAction, JobState, Record

# -- effects: carried out after the commit, in order; each is idempotent -------------------------


@dataclass(frozen=True)
class SendCommand:
    """Write the node's command key (run, stop or shut down a generation)."""

    node: str
    generation: int
    action: AgentAction


@dataclass(frozen=True)
class StartNode:
    node: str
    standby: bool = False
    role: str | None = None  # the role it serves (a standby waits for that role's nodes only)


@dataclass(frozen=True)
class StopNode:
    """Take the node away (off the loop: stopping waits out a grace period)."""

    node: str


@dataclass(frozen=True)
class CordonNode:
    node: str
    reason: str


@dataclass(frozen=True)
class UncordonNode:
    node: str


@dataclass(frozen=True)
class FenceNode:
    """Revoke the node's lease: a zombie agent that wakes up finds it gone and stops its workers."""

    node: str
    lease_id: int
    why: str


@dataclass(frozen=True)
class Launch:
    work: Work


@dataclass(frozen=True)
class Log:
    level: Literal["info", "warning", "error"]
    message: str
    fields: dict[str, Any] = field(default_factory=dict)


Effect = SendCommand | StartNode | StopNode | CordonNode | UncordonNode | FenceNode | Launch | Log


@dataclass(frozen=True)
class Needs:
    """More observation this tick's decision depends on: a listing of the cluster's nodes (asked
    for only when it matters: it is a pod listing on Kubernetes), or rendezvous addresses."""

    cluster: bool = False
    rendezvous: frozenset[str] = frozenset()
    incidents: frozenset[str] = frozenset()  # incidents to read (to attach a late verdict)

    def __bool__(self) -> bool:
        return self.cluster or bool(self.rendezvous) or bool(self.incidents)

    def __or__(self, other: Needs) -> Needs:
        return Needs(
            self.cluster or other.cluster, self.rendezvous | other.rendezvous, self.incidents | other.incidents
        )


@dataclass
class Decision:
    state: JobState | None  # the state to commit, or None when nothing is written
    revision: int  # the state's revision as read: the commit's guard
    puts: dict[str, Record]
    deletes: list[str]
    guards: dict[str, int]  # further keys whose revision must not have moved (operator requests)
    effects: list[Effect]
    consumed: frozenset[WorkKey]  # results this decision used (dropped once it holds)
    transitions: list[Row]
    acks: list[tuple[str, Any]]  # (detector, finding) handled: told once the commit holds
    evicted: list[str]  # nodes this decision evicted

    @property
    def writes(self) -> bool:
        return self.state is not None


class Plan:
    """A decision being made: a working copy of the state and what goes with it."""

    def __init__(self, state: JobState, revision: int, now: float, *, new: bool = False) -> None:
        self.before: JobState | None = None if new else state
        self.state = state.model_copy(deep=True)
        self.revision = revision
        self.now = now
        self.puts: dict[str, Record] = {}
        self.deletes: list[str] = []
        self.guards: dict[str, int] = {}
        self.effects: list[Effect] = []
        self.consumed: set[WorkKey] = set()
        self.transitions: list[Row] = []
        self.acks: list[tuple[str, Any]] = []
        self.evicted: list[str] = []

    def enter(self, trigger: Trigger) -> Row:
        taken = enter(self.state, trigger, self.now)
        self.transitions.append(taken)
        return taken

    def begin(self) -> Row:
        taken = begin(self.state, self.now)
        self.transitions.append(taken)
        return taken

    def put(self, key: str, record: Record) -> None:
        self.puts[key] = record

    def effect(self, *effects: Effect) -> None:
        self.effects.extend(effects)

    def log(self, level: Literal["info", "warning", "error"], message: str, **fields: Any) -> None:
        self.effects.append(Log(level, message, fields))

    @property
    def changed(self) -> bool:
        return bool(self.puts or self.deletes) or self.state != self.before

    def decision(self) -> Decision:
        return Decision(
            state=self.state if self.changed else None,
            revision=self.revision,
            puts=dict(self.puts),
            deletes=list(self.deletes),
            guards=dict(self.guards),
            effects=list(self.effects),
            consumed=frozenset(self.consumed),
            transitions=list(self.transitions),
            acks=list(self.acks),
            evicted=list(self.evicted),
        )
