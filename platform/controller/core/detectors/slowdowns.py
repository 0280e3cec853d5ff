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

A loaded machine is nobody's fault either: when the ranks time their phases and every rank's own
work (data, optimizer, the rest of the step) slowed with the pace while no rank of the named node
fell behind its peers, the rounds' lead (a rank caught computing, a node's metrics leaning) is the
load's noise, not a faulty node: no eviction without an outlier (`machine_wide`; the time a rank
waited for a CPU counts in the load, not in whether a rank fell behind). A step in which a
checkpoint save started (its staging) is no pace sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from statistics import median

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.detectors.node_digests import NodeDigests
from stalwart.controller.core.detectors.straggler_scores import own_work
from stalwart.controller.core.policy import PACE_WARMUP_SAMPLES, Classified, slowdown_onset
from stalwart.controller.core.work import StackDiagnosis, WorkResult
from stalwart.spec.model import FailureEvent
from stalwart.store.records import WorkerStatus

PACE_HISTORY = 200
PACE_QUIET_SECONDS = 10.0  # after rounds that blame no one; doubles each time
# Heartbeats (metric samples) from the onset before the last round: diagnosis' metric outliers
# weigh a metric fully once it was out for 10 windows of 5 samples in a row (14 samples), plus two.
METRIC_SAMPLES = 16
# A slowdown is the machine's load, not a node's, when the ranks' median own work rose this much
# with the pace while no rank of the named node gained on its peers CULPRIT_SHARE of the step's rise.
LOAD_RISE = 1.2
CULPRIT_SHARE = 0.25
MIN_OWN_SAMPLES = 3  # per rank, before the onset and since, to compare its own work

OwnWork = tuple[float, Mapping[int, float]]  # (time, rank -> own-work seconds of its last step)


class Slowdowns(Detector):
    name = "slowdowns"

    def reset(self) -> None:
        self._pace: list[tuple[float, float]] = []  # (time, the ranks' median step time), one per step
        self._own: list[OwnWork] = []  # the ranks' own work at each pace sample, where they time phases
        self._own_less_wait: list[OwnWork] = []  # the same, less the time each waited for a CPU
        self._paced_step: int | None = None
        self._quiet_until, self._backoff = 0.0, PACE_QUIET_SECONDS
        self._rounds = 0  # numbers the rounds of stacks (their work keys)
        self._asked: tuple[float, float, float] | None = None  # (onset, recent step time, asked at)
        self._baseline = 0.0  # the pace's median before the onset
        self._found: WorkResult | None = None  # the rounds' result, once back
        self._paces: NodeDigests[_NodePace] = NodeDigests(_node_pace)
        self._whole: tuple[int | None, bool, bool] | None = None  # (newest step, any step time, saving)

    def observe(self, view: View) -> Report:
        paces = self._paces.update(view)  # each node's running workers, redone for those that changed
        if self._whole is None or self._paces.changed:
            steps = [d.newest_step for d in paces.values() if d.newest_step is not None]
            self._whole = (
                max(steps) if steps else None,
                any(d.step_times for d in paces.values()),
                any(d.saving for d in paces.values()),
            )
        newest_step, timed, saving = self._whole
        # The pace is sampled while the rounds run too: a slowdown that ends by itself meanwhile
        # was transient (a load spike, a checkpoint's background work), not a node to evict.
        sampled = newest_step is not None and timed and newest_step != self._paced_step
        sampled = sampled and view.now >= self._quiet_until
        # A step in which a checkpoint save started carries its staging: a save's pace, not the job's.
        sampled = sampled and not saving
        if sampled:  # (nothing sampled while quiet, so a pause cannot turn into the baseline)
            times = sorted(chain.from_iterable(d.step_times for d in paces.values()))
            self._paced_step = newest_step
            self._pace = [*self._pace[-PACE_HISTORY + 1 :], (view.now, times[len(times) // 2])]
            own: dict[int, float] = {}
            less_wait: dict[int, float] = {}
            for d in paces.values():
                own.update(d.own)
                less_wait.update(d.own_less_wait)
            self._own = [*self._own[-PACE_HISTORY + 1 :], (view.now, own)]
            self._own_less_wait = [*self._own_less_wait[-PACE_HISTORY + 1 :], (view.now, less_wait)]
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

    def _load(self, view: View, suspects: Sequence[str]) -> bool:
        """The slowdown is the machine's load: see machine_wide."""
        assert self._asked is not None
        onset = self._asked[0]
        since = sorted(t for at, t in self._pace if at >= onset)
        if not since or self._baseline <= 0:
            return False
        ranks = {r for r, node in view.owners.items() if node in suspects}
        rise = since[len(since) // 2] - self._baseline
        warm = PACE_WARMUP_SAMPLES
        return machine_wide(self._own[warm:], onset, ranks, rise, less_wait=self._own_less_wait[warm:])

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
        if diagnosis is None or not diagnosis.suspects or self._ended(view) or self._load(view, diagnosis.suspects):
            # Everyone slowed down together, the slowdown ended by itself, or it is the machine's
            # load: forget the slow samples, keep the baseline, pause.
            self._pace = [p for p in self._pace if p[0] < onset]
            self._own = [o for o in self._own if o[0] < onset]
            self._own_less_wait = [o for o in self._own_less_wait if o[0] < onset]
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
        self._pace, self._own, self._own_less_wait, self._paced_step = [], [], [], None
        self._rounds, self._asked, self._found = self._rounds + 1, None, None


@dataclass(frozen=True)
class _NodePace:
    """What one node's running workers add to the pace: their newest step, step times (the truthy
    ones), whether one started a save, and each rank's own work (where the ranks time phases)."""

    newest_step: int | None
    step_times: tuple[float, ...]
    saving: bool
    own: Mapping[int, float]  # CPU wait included
    own_less_wait: Mapping[int, float]


def _node_pace(workers: Sequence[WorkerStatus], _sent_at: float | None = None) -> _NodePace:
    running = [w for w in workers if w.exit_code is None]
    steps = [w.step for w in running if w.step is not None]
    return _NodePace(
        newest_step=max(steps) if steps else None,
        step_times=tuple(w.step_time for w in running if w.step_time),
        saving=any(w.phases is not None and w.phases.saving for w in running),
        # (CPU wait included: the machine's load is what machine_wide looks for)
        own={
            w.rank: sum(o.values()) for w in running if (o := own_work(w.phases, None, less_cpu_wait=False)) is not None
        },
        own_less_wait={w.rank: sum(o.values()) for w in running if (o := own_work(w.phases, None)) is not None},
    )


def _medians(samples: Sequence[OwnWork], onset: float) -> tuple[dict[int, float], dict[int, float]]:
    """Each rank's median own work before `onset` and since, for the ranks with enough of both."""
    before: dict[int, list[float]] = {}
    after: dict[int, list[float]] = {}
    for at, own in samples:
        for rank, seconds in own.items():
            (after if at >= onset else before).setdefault(rank, []).append(seconds)
    ranks = [r for r in before if len(before[r]) >= MIN_OWN_SAMPLES and len(after.get(r, ())) >= MIN_OWN_SAMPLES]
    return {r: median(before[r]) for r in ranks}, {r: median(after[r]) for r in ranks}


def machine_wide(
    samples: Sequence[OwnWork],
    onset: float,
    suspects: set[int],
    rise: float,
    *,
    less_wait: Sequence[OwnWork] | None = None,
) -> bool:
    """Whether a slowdown of `rise` seconds a step since `onset` is the machine's load rather than
    the suspect ranks': the ranks' median own work rose LOAD_RISE times or more, and no suspect
    rank's own work gained on its peers' median CULPRIT_SHARE of the rise. A slow rank's own work
    (data, optimizer, the rest of its step) is where the job's lost time goes; a GPU or a link that
    slows one rank leaves the others' own work as it was. The rise counts the time the ranks waited
    for a CPU (`samples`: the load is what it looks for); whether a suspect fell behind does not
    (`less_wait`, where the SDK measured it): on a loaded host the scheduler serves some rank last
    after each collective, and that rank is no culprit. False when the phases cannot tell (a script
    that times none, too few samples, no suspect rank among them): the rounds decide."""
    was, now = _medians(samples, onset)
    ranks = sorted(was)
    if len(ranks) < 2 or rise <= 0 or not suspects & set(ranks):
        return False
    own_was, own_now = _medians(less_wait, onset) if less_wait is not None else (was, now)
    own_ranks = sorted(own_was)

    def excess(medians: Mapping[int, float], rank: int) -> float:
        return medians[rank] - median(medians[r] for r in own_ranks if r != rank)

    if len(own_ranks) >= 2 and any(
        excess(own_now, r) - excess(own_was, r) >= CULPRIT_SHARE * rise for r in suspects & set(own_ranks)
    ):
        return False  # a suspect fell behind its peers at its own work: the slowdown is its
    rises = [now[r] / was[r] for r in ranks if was[r] > 0]
    return bool(rises) and median(rises) >= LOAD_RISE


def metrics_ready_at(onset: float, view: View) -> float:
    return onset + METRIC_SAMPLES * view.progress_interval  # the metric samples come this often


def rounds_interval(asked: tuple[float, float, float], rounds: int, heartbeat: float) -> float:
    """Seconds between rounds: 1.5 steps at least (a round sees a new step), and spread so that
    the last round comes METRIC_SAMPLES heartbeats after the onset."""
    onset, recent, asked_at = asked
    spread = (onset + METRIC_SAMPLES * heartbeat - asked_at) / (rounds - 1) if rounds > 1 else 0.0
    return max(0.5, 1.5 * recent, spread)
