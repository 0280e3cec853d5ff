"""Lazy code updates: a new codeVersion in the spec is noted, applied when the next generation
starts, and forced (a CodeUpdate restart) once hotUpdateDeadlineSeconds have passed."""

from __future__ import annotations

from stalwart.controller.core.detectors.base import CodeUpdateSeen, Detector, Failure, Report, View
from stalwart.controller.core.policy import Classified
from stalwart.spec.model import FailureEvent


class CodeUpdates(Detector):
    name = "code-updates"

    def observe(self, view: View) -> Report:
        latest, state = view.spec.code_version, view.state
        if latest == state.code_version:
            return Report()
        if state.code_update_seen_at is None:
            return Report([CodeUpdateSeen(latest)])
        deadline = view.spec.hot_update_deadline_seconds
        if deadline is None or view.now - state.code_update_seen_at < deadline:
            return Report()
        evidence = [f"codeVersion {state.code_version} -> {latest}: deadline of {deadline:.0f}s passed"]
        return Report([Failure(Classified(FailureEvent.CODE_UPDATE, [], evidence), failed_at=view.now)])
