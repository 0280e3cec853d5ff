"""Rung 3: workers that exited non-zero, classified from their agents' verdicts (machine signature,
NaN, loss spike, the user's exception, or a plain crash), with diagnosis reading the logs too.

A crash is judged only once every slot node has been heard from since it: the peers of a dead
machine crash on its closed sockets long before its lease lapses, and that node is the failure
(lost_nodes.py). Diagnosis runs off the loop; a crash waits for it at most CRASH_DIAGNOSIS_WAIT.
"""

from __future__ import annotations

from stalwart.controller.detectors.base import Detector, Failure, Report, View
from stalwart.controller.diagnosis_link import Finding as Diagnosis
from stalwart.controller.policy import MACHINE_CLASSES, Classified, classify_crash
from stalwart.controller.work import CrashDiagnosis, WorkResult
from stalwart.spec.model import FailureEvent

CRASH_DIAGNOSIS_WAIT = 5.0


class Crashes(Detector):
    name = "crashes"

    def reset(self) -> None:
        self._asked: dict[tuple[str, ...], float] = {}  # diagnosis key -> when it was asked for
        self._diagnosed: dict[tuple[str, ...], WorkResult] = {}

    def observe(self, view: View) -> Report:
        crashed = view.crashed()
        if not crashed or view.lost():
            return Report()
        first_exit = crashed[0].exited_at or view.now
        if view.silent_since(first_exit):
            return Report()  # a node not heard from since: lost-nodes decides first
        pairs = [(view.owners[w.rank], w) for w in crashed if w.rank in view.owners]
        what = classify_crash(pairs)
        work = CrashDiagnosis(view.state.generation, first_exit, tuple(pairs))
        result = self._diagnosed.get(work.key) or view.result(work.key)
        if result is not None:
            self._diagnosed[work.key] = result
        if result is None:
            asked = self._asked.setdefault(work.key, view.now)
            if view.now - asked < CRASH_DIAGNOSIS_WAIT:
                return Report(work=[] if view.busy(work.key) else [work])
        elif result.diagnosis is not None:
            _refine(what, result.diagnosis)
        return Report([Failure(what, failed_at=first_exit, detected_at=view.now)])


def _refine(what: Classified, diagnosis: Diagnosis) -> None:
    """Diagnosis' verdict rides in the incident; a machine it names (a signature the agent's scan
    missed) upgrades a plain crash to a machine fault. A bare "it died first" does not (the OOM
    killer looks the same): the stop-time checks decide those."""
    what.verdict = diagnosis.verdict
    named = (diagnosis.verdict or {}).get("failure_class")
    if what.event is FailureEvent.WORKER_CRASH and named in MACHINE_CLASSES and diagnosis.suspects:
        what.event, what.suspects = FailureEvent.MACHINE_FAULT, list(diagnosis.suspects)
        what.runbook = diagnosis.runbook or "machine_fault"
        what.evidence = [*what.evidence, *diagnosis.evidence]
