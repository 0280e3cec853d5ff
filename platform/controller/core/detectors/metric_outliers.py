"""Minder-style: a node whose own pace stays far from its peers' (same role), from the metric vectors
its heartbeats carry.

In synchronous training every node steps together, so their step times and throughput agree and
this never fires: the pace (slowdowns.py) is what tells, and the metrics name the node inside that
diagnosis. It fires where nodes step on their own (RLHF rollout workers, independent replicas): a
node persistently `metric_outliers`' outlier on step time or throughput is a Slowdown, evicted by
default. Only nodes of one role are compared, and only this generation's samples after a warm-up.

A sample counts only when its node stepped since the one before: a step time that stays as it was
is not a measurement. And nothing is judged while a rank of the job has stopped progressing
altogether: its peers then wait in their collectives with their last step's numbers frozen, and a
jitter of that one step would read as a persistent outlier. That is a hang, the hang detector's
case (hangs.py), with its stack rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.detectors.node_digests import NodeDigests
from stalwart.controller.core.metric_windows import MAX_SAMPLES, series_of
from stalwart.controller.core.policy import Classified
from stalwart.controller.core.ranks import slot_roles
from stalwart.spec.model import FailureEvent
from stalwart.store.records import WorkerStatus

PACE_METRICS = ("step_time_s", "tokens_per_second")
WARMUP_SAMPLES = 2
MIN_NODES = 3  # fewer, and there are no "others" to compare with
# A rank is stalled when its last progress is older than this many of the job's recent step times
# (and than STALL_BEATS heartbeats: progress is seen no faster than the heartbeats carry it).
STALL_STEPS = 3.0
STALL_BEATS = 3


class MetricOutliers(Detector):
    name = "metric-outliers"

    def reset(self) -> None:
        self._evaluated_at = float("-inf")
        self._found: Report = Report()
        self._handled: set[str] = set()
        self._progress: NodeDigests[_NodeProgress] = NodeDigests(_node_progress)

    def observe(self, view: View) -> Report:
        """Evaluated once per progress interval (the samples come no faster)."""
        self._progress.update(view)  # every tick: a tick's few changed nodes, not every node once an interval
        if view.now - self._evaluated_at < view.progress_interval:
            return self._found
        self._evaluated_at = view.now
        self._found = self._evaluate(view)
        return self._found

    def _evaluate(self, view: View) -> Report:
        if self._stalled(view):
            return Report()  # the hang detector's case: a frozen step says nothing about pace
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

    def _stalled(self, view: View) -> bool:
        """Whether stalled_ranks(view) names any, from each node's digest (redone for the nodes
        whose heartbeat changed): only a node whose oldest progress is stale is looked into."""
        by_node = self._progress.update(view)
        times = sorted(chain.from_iterable(d.step_times for d in by_node.values()))
        if not times:
            return False
        limit = max(STALL_STEPS * times[len(times) // 2], STALL_BEATS * view.progress_interval)
        return any(d.oldest is not None and view.now - d.oldest > limit for d in by_node.values())

    def handled(self, finding: Finding, now: float) -> None:
        if isinstance(finding, Failure):
            self._handled.update(finding.what.suspects)
            self._found = Report()


def stalled_ranks(view: View) -> list[int]:
    """The running ranks with no progress for STALL_STEPS x the ranks' median step time."""
    running = [w for w in view.workers if w.exit_code is None]
    times = sorted(w.step_time for w in running if w.step_time)
    if not times:
        return []
    limit = max(STALL_STEPS * times[len(times) // 2], STALL_BEATS * view.progress_interval)
    return sorted(w.rank for w in running if w.last_progress_at is not None and view.now - w.last_progress_at > limit)


@dataclass(frozen=True)
class _NodeProgress:
    """One node's running ranks: their step times (the truthy ones) and the oldest progress one showed."""

    step_times: tuple[float, ...]
    oldest: float | None


def _node_progress(workers: Sequence[WorkerStatus], _sent_at: float | None = None) -> _NodeProgress:
    running = [w for w in workers if w.exit_code is None]
    seen = [at for w in running if (at := w.last_progress_at) is not None]
    return _NodeProgress(tuple(t for w in running if (t := w.step_time)), min(seen) if seen else None)


def _generation_window(vectors: Sequence[Mapping[str, Any]], since: float) -> list[Mapping[str, Any]]:
    """This generation's samples taken while the node ran workers, each a new step of the node's."""
    mine: list[Mapping[str, Any]] = []
    for v in vectors:
        if (v.get("at") or 0.0) < since or not v.get("workers_running"):
            continue
        if v.get("step") is not None and mine and v.get("step") == mine[-1].get("step"):
            continue  # the same step as the sample before: nothing new was measured
        mine.append(v)
    return mine[WARMUP_SAMPLES:]


def by_step(windows: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, list[Mapping[str, Any]]] | None:
    """The nodes' samples side by side by step: for every step any node sampled (the newest
    MAX_SAMPLES), that node's sample of it, or {} where it has none; None when no sample carries a
    step. Each node keeps one sample a step, taken whenever its agent's heartbeat came: side by side
    by position, a starved agent's n-th sample is of an older step than the others' n-th."""
    mine = {node: {v["step"]: v for v in reversed(w) if isinstance(v.get("step"), int)} for node, w in windows.items()}
    steps = sorted(set().union(*mine.values()))[-MAX_SAMPLES:]
    if not steps:
        return None
    return {node: [samples.get(step, {}) for step in steps] for node, samples in mine.items()}


def _outliers(role: str, windows: Mapping[str, Sequence[Mapping[str, Any]]], now: float) -> list[Finding]:
    from stalwart.diagnosis.metric_outliers import NAMED_SCORE, metric_outliers
    from stalwart.diagnosis.models import NodeMetrics

    stepped = by_step(windows) or windows  # the same step side by side: sampled at different moments
    metrics = []
    for node, window in sorted(stepped.items()):
        series = {k: v for k, v in series_of(window).items() if k in PACE_METRICS}
        metrics.append(NodeMetrics(node=node, series=series))
    found = metric_outliers(metrics)
    out: list[Finding] = []
    for node, score in sorted(found.node_scores.items()):
        if score < NAMED_SCORE:
            continue
        evidence = [f"{node} is a persistent outlier among the {len(windows)} {role} nodes (score {score:.2f})"]
        evidence += found.reasons.get(node, [])
        evidence.append(_pace_line(windows))
        what = Classified(FailureEvent.SLOWDOWN, [node], evidence, runbook="slowdown")
        out.append(Failure(what, failed_at=now, detected_at=now))
    return out


def _pace_line(windows: Mapping[str, Sequence[Mapping[str, Any]]], samples: int = 10) -> str:
    """Each node's median step time over its last samples: what on-call compares first."""
    medians = []
    for node, window in sorted(windows.items()):
        times = sorted(t for v in window[-samples:] if isinstance(t := v.get("step_time_s"), int | float))
        steps = [v.get("step") for v in window[-samples:]]
        medians.append(f"{node} {times[len(times) // 2]:.3f}s" if times else f"{node} -")
        medians[-1] += f" (steps {steps[0]}-{steps[-1]})"
    return f"median step time over the last {samples} samples: " + ", ".join(medians)
