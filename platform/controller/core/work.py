"""Long work the core asks for, as plain data: node checks and diagnosis.

The core never waits for a check or a stack capture. It asks for one with a `Launch` effect naming a
`Work`; the shell carries it out off the loop (stalwart.controller.shell.work) and hands back a
`WorkResult`, which the next tick sees as part of its observation. Keys make it idempotent: work
whose key is in flight, or whose result is waiting, is not launched again, and a controller that
restarts (losing its threads) simply launches again what its stage still needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stalwart.cluster.base import PreflightVerdict
from stalwart.spec import TrainingJobSpec
from stalwart.store.records import WorkerStatus


def check_procs(spec: TrainingJobSpec) -> int:
    """Processes per node for the checks: one per worker (per GPU), so every GPU of every node is checked."""
    return max(r.processes_per_node for r in spec.roles)


@dataclass
class Diagnosis:
    """What diagnosis concluded: the suspects, the evidence, the verdict, the runbook."""

    suspects: list[str]
    evidence: list[str] = field(default_factory=list)
    verdict: dict[str, Any] | None = None
    runbook: str | None = None


WorkKey = tuple[str, ...]
CheckPurpose = Literal["preflight", "stop-time", "standby", "request"]


@dataclass(frozen=True)
class NodeChecks:
    """Collective and compute checks on `nodes` (Cluster.preflight)."""

    purpose: CheckPurpose
    tag: str  # the pre-flight round, the generation, the standby or the request it is for
    nodes: tuple[str, ...]
    procs: int

    @property
    def key(self) -> WorkKey:
        return ("checks", self.purpose, self.tag)

    def describe(self) -> str:
        return f"{self.purpose} checks ({self.tag}) on {', '.join(self.nodes)}"


@dataclass(frozen=True, eq=False)
class StackDiagnosis:
    """Every rank's stack (rounds of them for a slowdown), with the nodes' metric windows, sent to
    diagnosis. `history` is the controller's own window per node, for agents that send none."""

    kind: Literal["hang", "slowdown"]
    generation: int
    attempt: int
    rounds: int = 1
    interval: float = 0.0
    history: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)

    @property
    def key(self) -> WorkKey:
        return ("stacks", self.kind, str(self.generation), str(self.attempt))

    def describe(self) -> str:
        what = f"{self.rounds} rounds of every rank's stack" if self.rounds > 1 else "every rank's stack"
        return f"{what} for a {self.kind} (generation {self.generation}, capture {self.attempt})"


@dataclass(frozen=True, eq=False)
class CrashDiagnosis:
    """The crashed workers' log tails, read by diagnosis (a machine signature upgrades the crash)."""

    generation: int
    first_exit: float
    crashed: tuple[tuple[str, WorkerStatus], ...]

    @property
    def key(self) -> WorkKey:
        return ("crash", str(self.generation), f"{self.first_exit:.6f}")

    def describe(self) -> str:
        return f"diagnosis of the crash of rank(s) {', '.join(str(w.rank) for _, w in self.crashed[:8])}"


Work = NodeChecks | StackDiagnosis | CrashDiagnosis


@dataclass(frozen=True)
class WorkResult:
    work: Work
    finished_at: float
    verdicts: list[PreflightVerdict] = field(default_factory=list)
    diagnosis: Diagnosis | None = None
    error: str | None = None

    @property
    def key(self) -> WorkKey:
        return self.work.key
