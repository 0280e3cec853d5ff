"""Long work, off the control loop: node checks and diagnosis.

The core never waits for a check or a stack capture. It asks for one with a `Launch` effect naming a
`Work` (plain data); a runner carries it out on a thread and hands back a `WorkResult`, which the
next tick sees as part of its observation. Keys make it idempotent: work whose key is in flight, or
whose result is waiting, is not launched again, and a controller that restarts (losing its threads)
simply launches again what its stage still needs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from stalwart.cluster.base import Cluster, PreflightVerdict
from stalwart.controller.clock import Clock
from stalwart.controller.diagnosis_link import Finding as Diagnosis
from stalwart.controller.diagnosis_link import diagnose_crash, diagnose_hang, diagnose_slowdown
from stalwart.logs import ContextLogger
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import Assignment, WorkerStatus

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


@dataclass
class WorkContext:
    """What carrying out work needs: the store, the cluster, where diagnosis is, a log and a clock."""

    store: Store
    cluster: Cluster
    job: str
    diagnosis_url: Callable[[], str | None]
    log: ContextLogger
    clock: Clock


def perform(work: Work, ctx: WorkContext) -> WorkResult:
    """Carry out one piece of work; a failure becomes the result's `error`, never an exception."""
    try:
        if isinstance(work, NodeChecks):
            verdicts = ctx.cluster.preflight(list(work.nodes), work.procs)
            return WorkResult(work, ctx.clock.time(), verdicts=verdicts)
        if isinstance(work, CrashDiagnosis):
            found = _assignment(ctx, work.generation)
            diagnosis = (
                diagnose_crash(ctx.job, found, list(work.crashed), ctx.diagnosis_url(), ctx.log, store=ctx.store)
                if found
                else None
            )
            return WorkResult(work, ctx.clock.time(), diagnosis=diagnosis)
        assignment = _assignment(ctx, work.generation)
        if assignment is None:
            return WorkResult(work, ctx.clock.time(), error=f"generation {work.generation} has no assignment")
        if work.kind == "hang":
            diagnosis = diagnose_hang(ctx.store, ctx.job, assignment, ctx.diagnosis_url(), ctx.log, work.history)
        else:
            diagnosis = diagnose_slowdown(
                ctx.store,
                ctx.job,
                assignment,
                ctx.diagnosis_url(),
                ctx.log,
                rounds=work.rounds,
                interval=work.interval,
                history=work.history,
            )
        # What the controller will decide from: on-call reads here why a slowdown evicted nobody.
        summary = (diagnosis.verdict or {}).get("summary") if diagnosis else None
        ctx.log.info(
            "long work finished",
            fields={"work": work.describe(), "suspects": diagnosis.suspects if diagnosis else [], "summary": summary},
        )
        return WorkResult(work, ctx.clock.time(), diagnosis=diagnosis)
    except Exception as exc:
        ctx.log.warning("work failed", fields={"work": "/".join(work.key), "error": repr(exc)})
        return WorkResult(work, ctx.clock.time(), error=f"{type(exc).__name__}: {exc}")


def _assignment(ctx: WorkContext, generation: int) -> Assignment | None:
    return ctx.store.get(keys.generation(ctx.job, generation), Assignment)


class Runner(Protocol):
    """Where work runs: threads in production, by hand in tests."""

    def launch(self, work: Work) -> None: ...

    def in_flight(self) -> frozenset[WorkKey]: ...

    def take(self) -> list[WorkResult]: ...


class ThreadRunner:
    """One thread per piece of work; `wake` is set when a result is ready, so the loop need not
    sleep out its tick."""

    def __init__(self, perform: Callable[[Work], WorkResult], wake: threading.Event) -> None:
        self._perform = perform
        self._wake = wake
        self._lock = threading.Lock()
        self._running: dict[WorkKey, threading.Thread] = {}
        self._done: list[WorkResult] = []

    def launch(self, work: Work) -> None:
        with self._lock:
            if work.key in self._running:
                return
            thread = threading.Thread(target=self._run, args=(work,), name="work-" + "-".join(work.key), daemon=True)
            self._running[work.key] = thread
        thread.start()

    def _run(self, work: Work) -> None:
        result = self._perform(work)
        with self._lock:
            self._done.append(result)
            self._running.pop(work.key, None)
        self._wake.set()

    def in_flight(self) -> frozenset[WorkKey]:
        with self._lock:
            return frozenset(self._running)

    def take(self) -> list[WorkResult]:
        with self._lock:
            done, self._done = self._done, []
        return done
