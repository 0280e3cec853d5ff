"""Stragglers: a rank slower than its peers at its own work, whatever the job's pace (NVRx-style
scores, straggler_scores.py), always on.

Each heartbeat brings every rank's last step with its phase times; each new step after the
generation's warm-up (stragglerWarmupSteps) becomes one sample of the rank's own work, except a
step in which a checkpoint save started (the SDK marks it). Once per progress interval every peer
group (one data-parallel group of a role) is scored on the medians of its ranks' last samples. A
rank under stragglerThreshold whose excess costs the job at least MIN_COST of its step time is a
suspect; it is a straggler once it stayed one for stragglerWindowSeconds, slow in STEADY of the
window's evaluations and at its end, and its node is the finding (a Slowdown: evicted and
hot-swapped by default). A suspect that comes back over the threshold plus HYSTERESIS is forgiven: a
straggler that recovers by itself is never evicted, and ranks slowed together (a data-mixture
change, a busy shared filesystem) keep their relative scores. On a loaded host a rank's own work
dips for a few seconds now and then, and a rank whose score hovers near the threshold between two
dips is no straggler: the share of slow evaluations tells the two apart.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import chain

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.detectors.node_digests import NodeDigests
from stalwart.controller.core.detectors.straggler_scores import (
    RankScore,
    Sample,
    Verdict,
    own_work,
    peer_groups,
    score_group,
    slow_ranks,
)
from stalwart.controller.core.policy import Classified
from stalwart.controller.core.ranks import role_states
from stalwart.spec.model import FailureEvent
from stalwart.store.records import WorkerStatus

HISTORY = 120  # samples kept per rank (the individual score's history)
RECENT = 12  # samples a score's medians are taken over (a few seconds of a loaded host's dips are noise)
MIN_SAMPLES = 5  # fewer recent samples, and a rank is neither scored nor compared with
MIN_COST = 0.05  # a suspect's excess own work, as a share of the job's median step time
HYSTERESIS = 0.05  # a suspect is forgiven only over threshold + this
STEADY = 0.75  # share of the evaluations since a rank was suspected that must find it slow


class Stragglers(Detector):
    name = "stragglers"

    def reset(self) -> None:
        self._samples: dict[int, deque[Sample]] = {}
        self._seen: dict[int, int] = {}  # rank -> the last step sampled
        self._suspects: dict[int, float] = {}  # rank -> suspected since
        self._tally: dict[int, list[int]] = {}  # rank -> [evaluations that found it slow, evaluations] since
        self._evaluated_at = float("-inf")
        self._found: Report = Report()
        self._handled: set[str] = set()
        self.scores: dict[int, RankScore] = {}  # the newest, for /metrics and status
        self._workers: NodeDigests[Sequence[WorkerStatus]] = NodeDigests(lambda workers, _sent_at: workers)
        self._step_times: NodeDigests[tuple[float, ...]] = NodeDigests(_running_step_times)

    def observe(self, view: View) -> Report:
        self._sample(view)
        self._step_times.update(view)  # every tick: a tick's few changed nodes, not every node once an interval
        if view.now - self._evaluated_at < view.progress_interval:
            return self._found
        self._evaluated_at = view.now
        self._found = self._evaluate(view)
        return self._found

    def _sample(self, view: View) -> None:
        """Sample the workers of the nodes whose heartbeat changed (a worker on another node has no
        new step: a walk over every worker would skip it)."""
        warmup = view.spec.fault_tolerance.straggler_warmup_steps
        by_node = self._workers.update(view)
        for w in (w for node in self._workers.changed for w in by_node[node]):
            if w.exit_code is not None or w.step is None or w.step == self._seen.get(w.rank):
                continue
            self._seen[w.rank] = w.step
            first = w.first_step if w.first_step is not None else w.step
            if w.step - first < warmup or (w.phases is not None and w.phases.saving):
                continue
            own = own_work(w.phases, w.step_time)
            if own is not None:
                self._samples.setdefault(w.rank, deque(maxlen=HISTORY)).append(Sample(w.step, own))

    def _evaluate(self, view: View) -> Report:
        ft = view.spec.fault_tolerance
        times = sorted(chain.from_iterable(self._step_times.update(view).values()))  # the running ranks'
        if not times:
            return Report()
        step_time = times[len(times) // 2]
        scores: dict[int, RankScore] = {}
        for group in self._groups(view):
            history = {r: self._samples[r] for r in group if r in self._samples}  # read, not copied
            scores.update(score_group(history, RECENT, min_samples=MIN_SAMPLES))
        self.scores = scores
        slow = slow_ranks(scores, ft.straggler_threshold, step_time, MIN_COST)
        for rank, s in scores.items():
            if rank in slow:
                self._suspects.setdefault(rank, view.now)
            elif s.relative >= ft.straggler_threshold + HYSTERESIS or s.excess / step_time < MIN_COST / 2:
                self._suspects.pop(rank, None)  # recovered by itself: forgiven
        for rank in list(self._suspects):
            if rank not in scores:
                self._suspects.pop(rank)  # no longer scored (exited, or too few samples)
        self._tally = {r: self._tally.get(r, [0, 0]) for r in self._suspects}
        for rank, tally in self._tally.items():
            tally[0] += rank in slow
            tally[1] += 1
        findings: list[Finding] = []
        for rank, since in sorted(self._suspects.items(), key=lambda kv: kv[1]):
            node = view.owners.get(rank)
            if rank not in slow or node is None or node in self._handled:
                continue
            found_slow, evaluations = self._tally[rank]
            if view.now - since >= ft.straggler_window_seconds and found_slow < STEADY * evaluations:
                self._suspects[rank], self._tally[rank] = view.now, [1, 1]  # dips, not a straggler: start over
            elif view.now - since >= ft.straggler_window_seconds:
                findings.append(
                    _finding(
                        view.state.job, view.state.generation, node, slow[rank], since, view.now, ft.straggler_threshold
                    )
                )
                break  # one incident per decision: the first suspect's
        return Report(findings)

    def _groups(self, view: View) -> list[list[int]]:
        """Job-wide ranks grouped by peers: per role, one group per model-parallel coordinate."""
        out: list[list[int]] = []
        states = role_states(view.spec)
        for role in view.spec.roles:
            p = role.parallelism
            first = states[role.name].first_rank
            for group in peer_groups(role.world_size, p.tensor, p.context, p.pipeline):
                out.append([first + r for r in group])
        return out

    def handled(self, finding: Finding, now: float) -> None:
        if isinstance(finding, Failure):
            self._handled.update(finding.what.suspects)
            self._found = Report()


def _running_step_times(workers: Sequence[WorkerStatus], _sent_at: float | None = None) -> tuple[float, ...]:
    return tuple(t for w in workers if w.exit_code is None and (t := w.step_time))


def _finding(
    job: str, generation: int, node: str, verdict: Verdict, since: float, now: float, threshold: float
) -> Failure:
    s = verdict.score
    evidence = [
        f"rank {s.rank} on {node} is a straggler: {verdict.cause}",
        f"its relative score stayed under {threshold:g} for {now - since:.0f}s (now {s.relative:.2f}: own work "
        f"{s.own * 1000:.0f} ms a step against its peers' median {s.peers * 1000:.0f} ms; individual score "
        f"{s.individual:.2f})",
        f"it costs every synchronous step about {verdict.cost:.0%} (most of it in phase '{s.phase}')",
    ]
    what = Classified(FailureEvent.SLOWDOWN, [node], evidence, runbook="slowdown", rank=s.rank)
    what.verdict = {  # shaped as diagnosis' Verdict, so that incidents and `stalwart diagnose` show it alike
        "job": job,
        "generation": generation,
        "failure_class": "straggler",
        "blame": "node",
        "suspects": [{"node": node, "score": round(1 - s.relative, 3), "reasons": evidence[:2], "ranks": [s.rank]}],
        "flagged": [node],
        "confidence": round(min(0.95, 0.5 + verdict.cost), 2),
        "action": "evict",
        "summary": f"{node} is a straggler ({verdict.cause}): rank {s.rank} at {s.relative:.2f} of its peers' pace",
        "runbook": "slowdown",
        "evidence": evidence,
        "straggler": {
            "rank": s.rank,
            "phase": s.phase,
            "cause": verdict.cause,
            "relative_score": round(s.relative, 3),
            "individual_score": round(s.individual, 3),
            "cost": round(verdict.cost, 3),
        },
    }
    what.diagnosed_at = now
    return Failure(what, failed_at=since, detected_at=now)
