"""MFU decline: the job's throughput down by throughputDecline (10%) from its generation's baseline
for throughputDeclineWindowSeconds, with no straggler named. Nothing here says which machine: the
incident (MFUDecline) restarts the job after the stop-time checks, which evict a node that fails
them (a throttled GPU, a slow link the collective check measures).

The pace is sampled once per progress interval after the straggler warm-up (tokens/s where the
ranks report tokens, else steps/s); the baseline is the median of the first window of samples, and
a decline is sustained when the last window's 80th percentile is down. The window is long (5
minutes by default): a straggler is the stragglers detector's to name within its own, shorter
window, and a job that slows for a while (a checkpoint's background write, a load spike) comes back
before it ends. A lasting change the checks do not explain becomes the next generation's baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from statistics import median

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.detectors.node_digests import NodeDigests
from stalwart.controller.core.detectors.throughput import Throughput, job_throughput
from stalwart.controller.core.policy import Classified
from stalwart.spec.model import FailureEvent
from stalwart.store.records import WorkerStatus

SUSTAINED = 0.8  # this share of the last window's samples must be down (its 80th percentile is)


class MfuDecline(Detector):
    name = "mfu-decline"

    def reset(self) -> None:
        self._samples: list[tuple[float, float]] = []  # (time, pace)
        self._sampled_at = float("-inf")
        self._fired = False
        self._runs: NodeDigests[_NodeRun] = NodeDigests(_node_run)

    def observe(self, view: View) -> Report:
        if self._fired:
            return Report()
        ft = view.spec.fault_tolerance
        self._runs.update(view)  # every tick: a tick's few changed nodes, not every node once an interval
        if view.now - self._sampled_at >= view.progress_interval:
            self._sampled_at = view.now
            pace = self._pace(view, ft.straggler_warmup_steps)
            if pace:
                self._samples.append((view.now, pace))
        window = ft.throughput_decline_window_seconds
        if not self._samples or self._samples[-1][0] - self._samples[0][0] < 2 * window:
            return Report()
        start = self._samples[0][0]
        baseline = median(p for t, p in self._samples if t <= start + window)
        now = self._samples[-1][0]
        recent = sorted(p for t, p in self._samples if t >= now - window)
        level = median(recent)
        if recent[int(SUSTAINED * (len(recent) - 1))] >= (1 - ft.throughput_decline) * baseline:
            # keep the baseline's window and the last one: memory stays bounded
            self._samples = [s for s in self._samples if s[0] <= start + window or s[0] >= now - window]
            return Report()
        unit = "tokens/s" if job_throughput(view.workers, view.spec).tokens_per_second is not None else "steps/s"
        evidence = [
            f"the job's throughput fell to {level:,.4g} {unit} (median of the last {window:g}s), "
            f"{1 - level / baseline:.0%} under this generation's baseline {baseline:,.4g}",
            "no straggler was named: the stop-time checks look at every node",
        ]
        what = Classified(FailureEvent.MFU_DECLINE, [], evidence, runbook="mfu_decline")
        return Report([Failure(what, failed_at=now - window, detected_at=view.now)])

    def _pace(self, view: View, warmup: int) -> float | None:
        """job_throughput(running ranks).pace once every running rank is past the warm-up, from
        each node's digest (redone for the nodes whose heartbeat changed), in the walk's order."""
        by_node = self._runs.update(view)
        least = [d.least_progress for d in by_node.values() if d.least_progress is not None]
        if not least or min(least) < warmup:
            return None
        tokens = list(chain.from_iterable(by_node[n].tokens for n in view.state.slots if n in by_node))
        times = [] if tokens else sorted(chain.from_iterable(d.step_times for d in by_node.values()))
        return Throughput(
            tokens_per_second=sum(tokens) if tokens else None,
            steps_per_second=1.0 / times[len(times) // 2] if times else None,
            flops_per_second=None,
            mfu=None,
        ).pace

    def handled(self, finding: Finding, now: float) -> None:
        if isinstance(finding, Failure) and finding.what.event is FailureEvent.MFU_DECLINE:
            self._fired = True  # once a generation: the next one starts a baseline of its own


@dataclass(frozen=True)
class _NodeRun:
    """One node's running ranks that stepped: the fewest steps one made in this generation, their
    tokens/s (the truthy ones, in order) and step times (the truthy ones)."""

    least_progress: int | None
    tokens: tuple[float, ...]
    step_times: tuple[float, ...]


def _node_run(workers: Sequence[WorkerStatus], _sent_at: float | None = None) -> _NodeRun:
    running = [w for w in workers if w.exit_code is None and w.step is not None]
    steps = [(w.step or 0) - (w.first_step if w.first_step is not None else (w.step or 0)) for w in running]
    return _NodeRun(
        least_progress=min(steps) if steps else None,
        tokens=tuple(t for w in running if (t := w.tokens_per_second)),
        step_times=tuple(t for w in running if (t := w.step_time)),
    )
