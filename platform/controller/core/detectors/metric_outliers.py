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
from typing import TYPE_CHECKING, Any

import numpy as np

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.detectors.node_digests import NodeDigests
from stalwart.controller.core.metric_windows import MAX_SAMPLES, number
from stalwart.controller.core.policy import Classified
from stalwart.controller.core.ranks import slot_roles
from stalwart.spec.model import FailureEvent
from stalwart.store.records import WorkerStatus

if TYPE_CHECKING:
    from stalwart.diagnosis.metric_outliers import Units

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
        self._samples: dict[str, _PaceSamples] = {}  # each node's, from its vectors
        self._since: float | None = None

    def observe(self, view: View) -> Report:
        """Evaluated once per progress interval (the samples come no faster)."""
        self._progress.update(view)  # every tick: a tick's few changed nodes, not every node once an interval
        self._update_samples(view)
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
            samples = {n: d for n in nodes if (d := self._samples.get(n)) is not None and len(d.values)}
            if len(samples) < MIN_NODES:
                continue
            for node, score, reasons in _outliers(samples):
                windows = {n: _generation_window(view.vectors.get(n, []), since) for n in samples}
                evidence = [f"{node} is a persistent outlier among the {len(samples)} {role} nodes (score {score:.2f})"]
                evidence += [*reasons, _pace_line(windows)]
                what = Classified(FailureEvent.SLOWDOWN, [node], evidence, runbook="slowdown")
                findings.append(Failure(what, failed_at=view.now, detected_at=view.now))
        return Report(findings)

    def _update_samples(self, view: View) -> None:
        """Each slot node's pace samples, redone for the nodes whose heartbeat (and so whose vectors)
        changed, as the progress digests just were: the evaluation, once an interval, then reads
        every node's at once."""
        since = view.state.generation_started_at or 0.0
        slots = self._progress.by_node
        if since != self._since:
            self._since, self._samples = since, {}
            redo: set[str] = set(slots)
        else:
            redo = self._progress.changed
        for node in redo:
            self._samples[node] = _pace_samples(_generation_window(view.vectors.get(node, []), since))
        if len(self._samples) > len(slots):  # a node left the slots
            self._samples = {n: d for n, d in self._samples.items() if n in slots}

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


@dataclass(frozen=True)
class _PaceSamples:
    """A node's pace samples of this generation (`_generation_window`'s), as arrays: each sample's
    value of each PACE_METRICS (NaN where it has none); `stepped` keeps, for each step a sample
    carries, the node's earliest sample of it."""

    values: np.ndarray  # (samples x metrics)
    stepped: tuple[np.ndarray, np.ndarray]  # (steps, values rows), ascending by step


def _pace_samples(window: Sequence[Mapping[str, Any]]) -> _PaceSamples:
    rows = [[number(v.get(m)) for m in PACE_METRICS] for v in window]
    values = np.array(rows, dtype=float).reshape(len(rows), len(PACE_METRICS))
    first: dict[int, int] = {}
    for i, v in enumerate(window):
        step = v.get("step")
        if isinstance(step, int) and step not in first:
            first[step] = i
    order = sorted(first)
    stepped = (np.array(order, dtype=np.int64), values[[first[k] for k in order]])
    return _PaceSamples(values, stepped)


def _units(samples: Mapping[str, _PaceSamples]) -> Units:
    """The nodes and their PACE_METRICS matrices (NaN where not measured; a metric no node measured
    has none), side by side by step: for every step any node sampled (the newest MAX_SAMPLES), that
    node's sample of it. Each node keeps one sample a step, taken whenever its agent's heartbeat
    came: side by side by position, a starved agent's n-th sample is of an older step than the
    others' n-th. By position (aligned on the newest) only when no sample carries a step."""
    from stalwart.diagnosis.metric_outliers import Units

    nodes = sorted(samples)
    steps = [samples[n].stepped[0] for n in nodes]
    every = np.concatenate(steps) if steps else np.empty(0, dtype=np.int64)
    if every.size:
        columns = np.unique(every)[-MAX_SAMPLES:]
        rows = np.repeat(np.arange(len(nodes)), [len(s) for s in steps])
        values = np.concatenate([samples[n].stepped[1] for n in nodes])
        keep = every >= columns[0]
        matrix = np.full((len(nodes), len(columns), len(PACE_METRICS)), np.nan)
        matrix[rows[keep], np.searchsorted(columns, every[keep])] = values[keep]
    else:  # no steps: by position, aligned on the newest sample
        length = min(MAX_SAMPLES, max(len(samples[n].values) for n in nodes))
        matrix = np.full((len(nodes), length, len(PACE_METRICS)), np.nan)
        for i, n in enumerate(nodes):
            tail = samples[n].values[-length:]
            matrix[i, length - len(tail) :] = tail
    measured = ~np.isnan(matrix).all(axis=(0, 1))
    matrices = {name: matrix[:, :, j] for j, name in enumerate(PACE_METRICS) if measured[j]}
    return Units(nodes, [None] * len(nodes), matrices)


def _outliers(samples: Mapping[str, _PaceSamples]) -> list[tuple[str, float, list[str]]]:
    """The nodes metric_outliers names (score at least NAMED_SCORE), with their scores and reasons."""
    from stalwart.diagnosis.metric_outliers import NAMED_SCORE, outliers_of

    found = outliers_of(_units(samples))
    return [
        (node, score, found.reasons.get(node, []))
        for node, score in sorted(found.node_scores.items())
        if score >= NAMED_SCORE
    ]


def _pace_line(windows: Mapping[str, Sequence[Mapping[str, Any]]], samples: int = 10) -> str:
    """Each node's median step time over its last samples: what on-call compares first."""
    medians = []
    for node, window in sorted(windows.items()):
        times = sorted(t for v in window[-samples:] if isinstance(t := v.get("step_time_s"), int | float))
        steps = [v.get("step") for v in window[-samples:]]
        medians.append(f"{node} {times[len(times) // 2]:.3f}s" if times else f"{node} -")
        medians[-1] += f" (steps {steps[0]}-{steps[-1]})"
    return f"median step time over the last {samples} samples: " + ", ".join(medians)
