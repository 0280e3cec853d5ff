"""Long work, off the control loop: node checks and diagnosis.

The core never waits for a check or a stack capture. It asks for one with a `Launch` effect naming a
`Work` (plain data); a runner carries it out on a thread and hands back a `WorkResult`, which the
next tick sees as part of its observation. Keys make it idempotent: work whose key is in flight, or
whose result is waiting, is not launched again, and a controller that restarts (losing its threads)
simply launches again what its stage still needs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from stalwart.cluster.base import Cluster
from stalwart.controller.core.work import CrashDiagnosis, NodeChecks, Work, WorkKey, WorkResult
from stalwart.controller.shell.clock import Clock
from stalwart.controller.shell.diagnosis import diagnose_crash, diagnose_hang, diagnose_slowdown
from stalwart.logs import ContextLogger
from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import Assignment


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
