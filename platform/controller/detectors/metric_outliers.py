"""Minder-style: a node whose own pace stays far from its peers' (same role), from the metric vectors
its heartbeats carry.

In synchronous training every node steps together, so their step times and throughput agree and
this never fires: the pace (slowdowns.py) is what tells, and the metrics name the node inside that
diagnosis. It fires where nodes step on their own (RLHF rollout workers, independent replicas): a
node persistently `metric_outliers`' outlier on step time or throughput is a Slowdown, evicted by
default. Only nodes of one role are compared, and only this generation's samples after a warm-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stalwart.controller.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.metric_windows import series_of
from stalwart.controller.policy import Classified
from stalwart.controller.ranks import slot_roles
from stalwart.spec.model import FailureEvent

PACE_METRICS = ("step_time_s", "tokens_per_second")
WARMUP_SAMPLES = 2
MIN_NODES = 3  # fewer, and there are no "others" to compare with
FLAG_SCORE = 0.6  # a metric out for twice the persistence, or two metrics out together


class MetricOutliers(Detector):
    name = "metric-outliers"

    def reset(self) -> None:
        self._evaluated_at = float("-inf")
        self._found: Report = Report()
        self._handled: set[str] = set()

    def observe(self, view: View) -> Report:
        """Evaluated once per heartbeat interval (the samples come no faster)."""
        if view.now - self._evaluated_at < view.spec.fault_tolerance.heartbeat_interval_seconds:
            return self._found
        self._evaluated_at = view.now
        self._found = self._evaluate(view)
        return self._found

    def _evaluate(self, view: View) -> Report:
        state = view.state
        since = state.generation_started_at or 0.0
        running = {n for n in state.slots if n in view.registrations and n not in self._handled}
        by_role: dict[str, list[str]] = {}
        for node, role in zip(state.slots, slot_roles(view.spec), strict=False):
            if node in running:
                by_role.setdefault(role, []).append(node)
        findings: list[Finding] = []
        for role, nodes in sorted(by_role.items()):
            windows = {n: _generation_window(view.vectors.get(n, []), since) for n in nodes}
            windows = {n: w for n, w in windows.items() if w}
            if len(windows) < MIN_NODES:
                continue
            findings += _outliers(role, windows, view.now)
        return Report(findings)

    def handled(self, finding: Finding, now: float) -> None:
        if isinstance(finding, Failure):
            self._handled.update(finding.what.suspects)
            self._found = Report()


def _generation_window(vectors: Sequence[Mapping[str, Any]], since: float) -> list[Mapping[str, Any]]:
    mine = [v for v in vectors if (v.get("at") or 0.0) >= since and v.get("workers_running")]
    return mine[WARMUP_SAMPLES:]


def _outliers(role: str, windows: Mapping[str, Sequence[Mapping[str, Any]]], now: float) -> list[Finding]:
    from stalwart.diagnosis.metric_outliers import metric_outliers
    from stalwart.diagnosis.models import NodeMetrics

    metrics = []
    for node, window in sorted(windows.items()):
        series = {k: v for k, v in series_of(window).items() if k in PACE_METRICS}
        metrics.append(NodeMetrics(node=node, series=series))
    found = metric_outliers(metrics)
    out: list[Finding] = []
    for node, score in sorted(found.node_scores.items()):
        if score < FLAG_SCORE:
            continue
        evidence = [f"{node} is a persistent outlier among the {len(windows)} {role} nodes (score {score:.2f})"]
        evidence += found.reasons.get(node, [])
        what = Classified(FailureEvent.SLOWDOWN, [node], evidence, runbook="slowdown")
        out.append(Failure(what, failed_at=now, detected_at=now))
    return out
