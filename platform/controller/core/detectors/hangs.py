"""Rung 4, hangs: no rank progressed for longer than the adaptive timeout (a multiple of the recent
step time, never NCCL's 30 minutes). Every rank's stack is captured off the loop, with the nodes'
metric windows, and diagnosis names the node the outliers share. A capture that blames no one is
looked at again one timeout later before anything restarts; progress in the meantime ends it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import chain

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.detectors.node_digests import NodeDigests
from stalwart.controller.core.policy import Classified, hang_timeout
from stalwart.controller.core.work import StackDiagnosis, WorkResult
from stalwart.spec.model import FailureEvent
from stalwart.store.records import WorkerStatus


@dataclass
class _Stall:
    since: float  # the last progress
    timeout: float
    detected_at: float  # when the first capture was asked for
    first: int  # the first capture's number
    capture: int  # the capture followed now
    judged: WorkResult | None = None


@dataclass(frozen=True)
class _Pace:
    """A node's running workers, as the hang timeout needs them."""

    running: int
    last_progress: float | None
    step_times: tuple[float, ...]
    reported_at: float | None  # when the heartbeat that says so was sent (None: nothing running)
    finite_times: tuple[float, ...]  # the step times the timeout is a multiple of (hang_timeout's)


def _pace(workers: Sequence[WorkerStatus], sent_at: float | None = None) -> _Pace:
    running = [w for w in workers if w.exit_code is None]
    progress = [w.last_progress_at for w in running if w.last_progress_at is not None]
    steps = tuple(w.step_time for w in running if w.step_time)
    finite = tuple(t for t in steps if math.isfinite(t))
    return _Pace(len(running), max(progress, default=None), steps, sent_at if running else None, finite)


class Hangs(Detector):
    name = "hangs"

    def reset(self) -> None:
        self._stall: _Stall | None = None
        self._captures = 0  # numbers the captures of this generation (their work keys)
        self._quiet_until = 0.0  # after a hang was handled without a restart (an Ignore rule)
        self._digests: NodeDigests[_Pace] = NodeDigests(_pace)
        self._whole: tuple[bool, float | None, list[float], float | None] | None = None
        self._median: list[float] = []

    def observe(self, view: View) -> Report:
        running, last_progress, _, newest_report = self._pace(view)
        ft = view.spec.fault_tolerance
        if last_progress is not None:
            # (hang_timeout of every step time, from the median kept with the digests)
            timeout = hang_timeout(self._median, ft.hang_timeout_multiplier, ft.hang_timeout_floor_seconds)
            # A big job's progress is seen up to a progress interval late (not a heartbeat interval):
            # the timeout waits that much longer, so the margin is what it is for a small job; unless
            # a node already reported, a whole timeout after the newest progress any rank showed,
            # that its ranks made none (a stuck node still writes once per progress interval).
            if newest_report is None or newest_report - last_progress <= timeout:
                timeout += view.progress_lag
            since = last_progress
        else:
            timeout = ft.first_step_timeout_seconds
            since = view.state.generation_started_at or view.state.updated_at
        if self._stall is not None and since > self._stall.since:
            if view.now - since <= timeout:
                self._stall = None  # progress again: that stall is over
            else:  # a late report of progress older than the timeout: the same silence, a later start
                self._stall.since = since
        if self._stall is not None and not running:
            self._stall = None  # nothing left running
        if not running:
            return Report()
        if self._stall is None:
            if view.now - since <= timeout or view.now < self._quiet_until:
                return Report()
            self._stall = _Stall(since, timeout, view.now, first=self._captures, capture=self._captures)
            self._captures += 1
        return self._follow(view, self._stall)

    def _pace(self, view: View) -> tuple[bool, float | None, list[float], float | None]:
        """(any worker running, the newest progress of a running one, the running ones' step
        times, the newest heartbeat of a node running any), from each node's digest: redone for
        the nodes whose heartbeat changed."""
        by_node = self._digests.update(view)
        if self._digests.changed or self._whole is None:
            paces = by_node.values()
            progress = [p for pace in paces if (p := pace.last_progress) is not None]
            reports = [r for pace in paces if (r := pace.reported_at) is not None]
            self._whole = (
                any(pace.running for pace in paces),
                max(progress) if progress else None,
                list(chain.from_iterable(pace.step_times for pace in paces)),
                max(reports) if reports else None,
            )
            # hang_timeout's median, of the times it keeps: [] or the one element it would pick
            finite = sorted(chain.from_iterable(pace.finite_times for pace in paces))
            self._median = finite[len(finite) // 2 : len(finite) // 2 + 1]
        return self._whole

    def _follow(self, view: View, stall: _Stall) -> Report:
        work = StackDiagnosis("hang", view.state.generation, stall.capture)
        stall.judged = stall.judged or view.result(work.key)
        if stall.judged is None:
            return Report(work=[] if view.busy(work.key) else [replace(work, history=view.slot_vectors())])
        diagnosis = stall.judged.diagnosis
        suspects = list(diagnosis.suspects) if diagnosis else []
        if not suspects and stall.capture == stall.first:
            # No suspect (stacks unusable, or the workers are finishing): look again after another
            # timeout before restarting anything.
            if view.now < stall.judged.finished_at + stall.timeout:
                return Report()
            stall.capture, stall.judged = self._captures, None
            self._captures += 1
            return self._follow(view, stall)
        what = Classified(
            FailureEvent.HANG,
            suspects,
            [f"no progress for {stall.detected_at - stall.since:.1f}s (timeout {stall.timeout:.1f}s)"]
            + (diagnosis.evidence if diagnosis else [f"no diagnosis: {stall.judged.error or 'none'}"]),
            runbook=(diagnosis.runbook if diagnosis else None) or "hang",
        )
        what.verdict = diagnosis.verdict if diagnosis else None
        what.diagnosed_at = stall.judged.finished_at
        return Report([Failure(what, failed_at=stall.since, detected_at=stall.detected_at)])

    def handled(self, finding: Finding, now: float) -> None:
        if self._stall is not None:
            self._quiet_until = now + self._stall.timeout
            self._stall = None
