"""Rung 4, slowdowns: the generation's pace (one step-time sample per step seen) against its own
baseline. Past `slowdownFactor` x the baseline, `slowdownRounds` rounds of stacks are taken off the
loop, with the nodes' metric windows; the node the others keep waiting for, or the one its metrics
single out, is the finding. In synchronous training every rank reports the same step time, so the
pace says that someone is slow and the stacks and metrics say who.

The rounds are spread so that the last one comes when the slow node's metrics have had time to
persist (METRIC_SAMPLES heartbeats since the onset): stacks alone often catch nobody (a rank that
sleeps between collectives, an oversubscribed host), and its own-work phase times then name it.

The pace is still sampled while the rounds run: when the steps since they were asked for are back
under the factor, the slowdown was transient (a load spike, a checkpoint's background work) and
nobody is evicted, whatever the rounds say.

Whatever the rounds find, the pace starts over: a slowdown nobody is to blame for (a data change, a
shared filesystem) drops its slow samples and is looked at again only after a pause that doubles
each time, so a slowdown that lasts becomes the baseline by itself.
"""

from __future__ import annotations

from dataclasses import replace

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.policy import PACE_WARMUP_SAMPLES, Classified, slowdown_onset
from stalwart.controller.core.work import StackDiagnosis, WorkResult
from stalwart.spec.model import FailureEvent

PACE_HISTORY = 200
PACE_QUIET_SECONDS = 10.0  # after rounds that blame no one; doubles each time
# Heartbeats (metric samples) from the onset before the last round: diagnosis' metric outliers
# weigh a metric fully once it was out for 10 windows of 5 samples in a row (14 samples), plus two.
METRIC_SAMPLES = 16


class Slowdowns(Detector):
    name = "slowdowns"

    def reset(self) -> None:
        self._pace: list[tuple[float, float]] = []  # (time, the ranks' median step time), one per step
        self._paced_step: int | None = None
        self._quiet_until, self._backoff = 0.0, PACE_QUIET_SECONDS
        self._rounds = 0  # numbers the rounds of stacks (their work keys)
        self._asked: tuple[float, float, float] | None = None  # (onset, recent step time, asked at)
        self._baseline = 0.0  # the pace's median before the onset
        self._found: WorkResult | None = None  # the rounds' result, once back

    def observe(self, view: View) -> Report:
        running = [w for w in view.workers if w.exit_code is None]
        steps = [w.step for w in running if w.step is not None]
        times = sorted(w.step_time for w in running if w.step_time)
        # The pace is sampled while the rounds run too: a slowdown that ends by itself meanwhile
        # was transient (a load spike, a checkpoint's background work), not a node to evict.
        sampled = bool(steps and times and max(steps) != self._paced_step and view.now >= self._quiet_until)
        if sampled:  # (nothing sampled while quiet, so a pause cannot turn into the baseline)
            self._paced_step = max(steps)
            self._pace = [*self._pace[-PACE_HISTORY + 1 :], (view.now, times[len(times) // 2])]
        if self._asked is not None:
            return self._follow(view)
        if not sampled:
            return Report()
        onset = slowdown_onset(self._pace, view.spec.fault_tolerance.slowdown_factor)
        if onset is None:
            return Report()
        self._asked = (onset, self._pace[-1][1], view.now)
        before = sorted(t for at, t in self._pace[PACE_WARMUP_SAMPLES:] if at < onset)
        self._baseline = before[len(before) // 2] if before else 0.0
        return self._follow(view)

    def _ended(self, view: View) -> bool:
        """The pace came back under the factor while the rounds ran (the steps since they were asked for)."""
        assert self._asked is not None
        since = sorted(t for at, t in self._pace if at > self._asked[2])
        factor = view.spec.fault_tolerance.slowdown_factor
        return bool(since) and self._baseline > 0 and since[len(since) // 2] <= factor * self._baseline

    def _work(self, view: View) -> StackDiagnosis:
        assert self._asked is not None
        ft = view.spec.fault_tolerance
        return StackDiagnosis(
            "slowdown",
            view.state.generation,
            self._rounds,
            rounds=ft.slowdown_rounds,
            interval=rounds_interval(self._asked, ft.slowdown_rounds, view.progress_interval),
        )

    def _follow(self, view: View) -> Report:
        assert self._asked is not None
        onset, recent, asked_at = self._asked
        work = self._work(view)
        result = self._found = self._found or view.result(work.key)
        if result is None and work.rounds == 1 and view.now < metrics_ready_at(onset, view):
            return Report()  # one round: taken once the metrics can tell
        if result is None:
            return Report(work=[] if view.busy(work.key) else [replace(work, history=view.slot_vectors())])
        diagnosis = result.diagnosis
        if diagnosis is None or not diagnosis.suspects or self._ended(view):
            # Everyone slowed down together, or the slowdown ended by itself: forget the slow
            # samples, keep the baseline, pause.
            self._pace = [p for p in self._pace if p[0] < onset]
            self._quiet_until, self._backoff = result.finished_at + self._backoff, 2 * self._backoff
            self._rounds, self._asked, self._found = self._rounds + 1, None, None
            return Report()
        factor = view.spec.fault_tolerance.slowdown_factor
        what = Classified(
            FailureEvent.SLOWDOWN,
            list(diagnosis.suspects),
            [f"step time {recent:.3g}s, more than {factor:g}x this generation's baseline", *diagnosis.evidence],
            runbook=diagnosis.runbook or "slowdown",
        )
        what.verdict, what.diagnosed_at = diagnosis.verdict, result.finished_at
        return Report([Failure(what, failed_at=onset, detected_at=asked_at)])

    def handled(self, finding: Finding, now: float) -> None:
        """Handled, or tolerated by an Ignore rule: the pace starts a new baseline."""
        self._pace, self._paced_step = [], None
        self._rounds, self._asked, self._found = self._rounds + 1, None, None


def metrics_ready_at(onset: float, view: View) -> float:
    return onset + METRIC_SAMPLES * view.progress_interval  # the metric samples come this often


def rounds_interval(asked: tuple[float, float, float], rounds: int, heartbeat: float) -> float:
    """Seconds between rounds: 1.5 steps at least (a round sees a new step), and spread so that
    the last round comes METRIC_SAMPLES heartbeats after the onset."""
    onset, recent, asked_at = asked
    spread = (onset + METRIC_SAMPLES * heartbeat - asked_at) / (rounds - 1) if rounds > 1 else 0.0
    return max(0.5, 1.5 * recent, spread)
