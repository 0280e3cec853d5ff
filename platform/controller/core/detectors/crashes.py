"""Rung 3: workers that exited non-zero, classified from their agents' verdicts (machine signature,
NaN, loss spike, the user's exception, or a plain crash), with diagnosis reading the logs too.

A crash is judged only once every slot node has been heard from since it: the peers of a dead
machine crash on its closed sockets long before its lease lapses, and that node is the failure
(lost_nodes.py). Diagnosis runs off the loop; a crash waits for it at most CRASH_DIAGNOSIS_WAIT.
A verdict that comes later is not dropped: the detector keeps watching, whatever the stage and
generation, and its incident gains the verdict (LateVerdict) once it is back.
"""

from __future__ import annotations

from stalwart.controller.core.decision import Needs
from stalwart.controller.core.detectors.base import Detector, Failure, Finding, LateVerdict, Report, View
from stalwart.controller.core.detectors.node_digests import FailureWatch
from stalwart.controller.core.policy import MACHINE_CLASSES, Classified, classify_crash
from stalwart.controller.core.work import CrashDiagnosis, Diagnosis, WorkKey, WorkResult
from stalwart.spec.model import FailureEvent
from stalwart.store.records import JobStage

CRASH_DIAGNOSIS_WAIT = 5.0


class Crashes(Detector):
    name = "crashes"
    # Crashes are judged while the job runs; a late verdict is attached in any stage.
    stages = frozenset(s for s in JobStage if not s.terminal)

    def __init__(self) -> None:
        super().__init__()
        # Diagnoses still running when their crash was handled: key -> its incident.
        self._late: dict[WorkKey, str] = {}

    def reset(self) -> None:
        self._asked: dict[WorkKey, float] = {}  # diagnosis key -> when it was asked for
        self._diagnosed: dict[WorkKey, WorkResult] = {}
        self._unjudged: WorkKey | None = None  # the diagnosis the last crash finding went without
        self._failures = FailureWatch()  # the workers that exited non-zero, kept per node

    def observe(self, view: View) -> Report:
        late = self._late_verdicts(view)
        if view.state.stage is not JobStage.RUNNING:
            return late
        found = self._crash(view)
        found.findings += late.findings
        found.needs = found.needs | late.needs
        return found

    def _late_verdicts(self, view: View) -> Report:
        out = Report()
        for key, incident in list(self._late.items()):
            result = view.result(key)
            if result is None:
                if not view.busy(key):
                    del self._late[key]  # lost (the controller restarted, the result expired)
                continue
            if result.diagnosis is None or result.diagnosis.verdict is None:
                del self._late[key]  # came back with nothing to attach
                continue
            out.needs = out.needs | Needs(incidents=frozenset({incident}))
            out.findings.append(LateVerdict(incident, result.diagnosis.verdict, result.finished_at))
        return out

    def handled(self, finding: Finding, now: float) -> None:
        if isinstance(finding, LateVerdict):
            self._late = {k: v for k, v in self._late.items() if v != finding.incident}
        elif isinstance(finding, Failure) and finding.incident is not None:
            key, self._unjudged = self._unjudged, None
            if key is not None:
                self._late[key] = finding.incident

    def _crash(self, view: View) -> Report:
        crashed = self._failures.crashed(view)
        if not crashed or view.lost():
            return Report()
        first_exit = self._failures.first_exit(view) or view.now
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
            what.diagnosed_at = result.finished_at
        self._unjudged = work.key if result is None else None  # handled without it: attached when it comes
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
