"""What the tick keeps per node instead of walking every worker (issue 42): the job's progress and
completion, the checkpoint catalog's merge, the straggler samples, the slowdown pace, the MFU
decline's pace, the metric outliers' stalled check and the hang timeout. On random sequences of
heartbeats, each incremental path finds what the walk over every worker (or every heartbeat) finds."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.controller_harness import JOB, heartbeats_only, spec_document, worker

from stalwart.controller.core import catalog
from stalwart.controller.core.decision import Plan
from stalwart.controller.core.detectors.base import View
from stalwart.controller.core.detectors.hangs import Hangs
from stalwart.controller.core.detectors.metric_outliers import MetricOutliers, stalled_ranks
from stalwart.controller.core.detectors.mfu_decline import MfuDecline
from stalwart.controller.core.detectors.node_digests import ProgressWatch
from stalwart.controller.core.detectors.slowdowns import Slowdowns
from stalwart.controller.core.detectors.stragglers import Stragglers
from stalwart.controller.core.detectors.throughput import job_throughput
from stalwart.controller.core.observation import BeatChanges, Observation
from stalwart.controller.core.policy import hang_timeout
from stalwart.controller.core.progress import progress_of
from stalwart.spec import parse_job
from stalwart.store.records import (
    CheckpointEntry,
    Heartbeat,
    JobStage,
    JobState,
    PhaseTimes,
    SavedCheckpoint,
    WorkerStatus,
)

NODES = [f"node-{i}" for i in range(5)]
SPEC = parse_job(
    spec_document(
        roles=[{"name": "trainer", "replicas": 5, "processesPerNode": 2, "command": ["x"]}],
        faultTolerance={"stragglerWarmupSteps": 1},
        checkpoint={"keepLast": 2},
    )
)


def state(generation: int = 1, resume_max_step: int | None = None) -> JobState:
    return JobState(
        job=JOB,
        stage=JobStage.RUNNING,
        generation=generation,
        slots=NODES,
        generation_started_at=0.0,
        created_at=0.0,
        updated_at=0.0,
        resume_max_step=resume_max_step,
    )


def observe(
    now: float,
    st_: JobState,
    beats: dict[str, Heartbeat],
    changes: BeatChanges | None,
    entries: dict[int, CheckpointEntry] | None = None,
) -> Observation:
    return heartbeats_only(now, st_, SPEC, beats, changes, entries)


def node_workers(draw: st.DrawFn, node: int, now: float) -> list[WorkerStatus]:
    out = []
    for local in range(2):
        exit_code = draw(st.sampled_from([None, None, None, 0, 1]))
        step = draw(st.sampled_from([None, 3, 5, 8, 9]))
        out.append(
            worker(
                2 * node + local,
                exit_code=exit_code,
                at=draw(st.sampled_from([0.0, now - 40, now - 1])),
                step=step,
                first_step=draw(st.sampled_from([None, 1, 4])),
                first_step_at=draw(st.sampled_from([None, 1.0, 2.5])),
                loss=draw(st.sampled_from([None, 1.0, 2.5, float("nan")])),
                step_time=draw(st.sampled_from([None, 0.0, 0.5, 1.5, 4.0, float("inf")])),
                tokens_per_second=draw(st.sampled_from([None, 0.0, 100.5, 300.25])),
                last_checkpoint_step=draw(st.sampled_from([None, 2, 6])),
                phases=draw(
                    st.sampled_from(
                        [None, PhaseTimes(data=0.1, compute=0.3), PhaseTimes(compute=0.2, saving=True), PhaseTimes()]
                    )
                ),
            )
        )
    return out


def saves(draw: st.DrawFn, now: float) -> list[SavedCheckpoint]:
    steps = draw(st.lists(st.sampled_from([10, 20, 30, 40]), unique=True, max_size=3))
    return [
        SavedCheckpoint(
            step=s,
            generation=draw(st.sampled_from([1, 1, 2])),
            committed_at=draw(st.sampled_from([now, now - 5, 0.0])),
            tiers=draw(st.sampled_from([[], ["memory"]])),
            total_bytes=draw(st.sampled_from([None, 10, 99])),
            location=f"s3://bucket/step-{s}",
        )
        for s in steps
    ]


Round = tuple[list[int], dict[int, list[WorkerStatus]], dict[int, list[SavedCheckpoint]], int, bool]


@st.composite
def rounds(draw: st.DrawFn) -> list[Round]:
    """Each round: the nodes whose heartbeat changed, their workers and saves, the beat's
    generation, and whether the round's catalog writes are committed."""
    out = []
    for r in range(draw(st.integers(1, 7))):
        now = 10.0 * (r + 1)
        changed = draw(st.lists(st.integers(0, len(NODES) - 1), unique=True, max_size=len(NODES)))
        out.append(
            (
                changed,
                {n: node_workers(draw, n, now) for n in changed},
                {n: saves(draw, now) for n in changed},
                draw(st.sampled_from([1, 1, 1, 0])),
                draw(st.sampled_from([True, True, False])),
            )
        )
    return out


def _samples(detector: Stragglers) -> dict[int, list[Any]]:
    return {rank: list(samples) for rank, samples in detector._samples.items()}


@settings(max_examples=80, deadline=None)
@given(rounds(), st.sampled_from([None, 5, 25]))
def test_each_incremental_path_finds_what_the_walk_finds(plan: list[Round], bound: int | None) -> None:
    st_ = state(resume_max_step=bound)
    beats: dict[str, Heartbeat] = {}
    log: list[str] = []
    entries: dict[int, CheckpointEntry] = {}
    watch, feed = ProgressWatch(), catalog.CatalogFeed()
    stragglers, stragglers_walk = Stragglers(), Stragglers()
    slowdowns, slowdowns_walk = Slowdowns(), Slowdowns()
    mfu, outliers, hangs = MfuDecline(), MetricOutliers(), Hangs()
    for detector in (stragglers, stragglers_walk, slowdowns, slowdowns_walk, mfu, outliers, hangs):
        detector.reset()
    for r, (changed, workers, saved, generation, committed) in enumerate(plan):
        now = 10.0 * (r + 1)
        for n in changed:
            beats[NODES[n]] = Heartbeat(
                node=NODES[n], generation=generation, sent_at=now, workers=workers[n], checkpoints=saved[n]
            )
            log.append(NODES[n])
        view = View.of(observe(now, st_, beats, BeatChanges(log, 0, len(log)), entries), st_)
        walk = View.of(observe(now, st_, beats, None, entries), st_)  # no changes known: every node
        every = view.workers

        # The job's progress and completion (reconcile's running branch).
        progress, count, exited_zero = watch.update(view)
        walked = progress_of(every)
        assert (progress.newest_step, progress.first_step_at, progress.newest_checkpoint) == (
            walked.newest_step,
            walked.first_step_at,
            walked.newest_checkpoint,
        )
        assert repr(progress.rank0_loss) == repr(walked.rank0_loss)  # (NaN included)
        assert progress.rates() == walked.rates()
        assert (count, exited_zero) == (len(every), sum(1 for w in every if w.exit_code == 0))

        # The catalog: what the feed writes is what a merge of every heartbeat's saves writes.
        by_feed, by_walk = Plan(st_, 1, now), Plan(st_, 1, now)
        feed.update(by_feed, view.obs, SPEC.spec.checkpoint.keep_last, JOB)
        catalog.update(by_walk, entries, beats, SPEC.spec.checkpoint.keep_last, JOB)
        assert (by_feed.puts, sorted(by_feed.deletes)) == (by_walk.puts, sorted(by_walk.deletes))
        if committed:
            for entry in by_walk.puts.values():
                assert isinstance(entry, CheckpointEntry)
                entries[entry.step] = entry
            for key in by_walk.deletes:
                entries.pop(int(key.rsplit("/", 1)[1]), None)

        # The straggler samples and the slowdown pace: from the changed nodes, or from every node.
        stragglers._sample(view)
        stragglers_walk._sample(walk)
        assert _samples(stragglers) == _samples(stragglers_walk) and stragglers._seen == stragglers_walk._seen
        kept = sorted(t for times in stragglers._step_times.update(view).values() for t in times)
        assert kept == sorted(w.step_time for w in every if w.exit_code is None and w.step_time)
        slowdowns.observe(view)
        slowdowns_walk.observe(walk)
        assert (slowdowns._pace, slowdowns._own, slowdowns._paced_step) == (
            slowdowns_walk._pace,
            slowdowns_walk._own,
            slowdowns_walk._paced_step,
        )

        # The MFU decline's pace and the metric outliers' stalled check, against the walk.
        running = [w for w in every if w.exit_code is None and w.step is not None]
        steps = [(w.step or 0) - (w.first_step if w.first_step is not None else (w.step or 0)) for w in running]
        warm = bool(steps) and min(steps) >= SPEC.spec.fault_tolerance.straggler_warmup_steps
        assert mfu._pace(view, SPEC.spec.fault_tolerance.straggler_warmup_steps) == (
            job_throughput(running, SPEC.spec).pace if warm else None
        )
        assert outliers._stalled(view) == bool(stalled_ranks(view))

        # The hang timeout: from the median kept with the digests, as from every running rank's step time.
        hangs._pace(view)
        walked_times = [w.step_time for w in every if w.exit_code is None and w.step_time]
        assert hang_timeout(hangs._median, 3.0, 1.0) == hang_timeout(walked_times, 3.0, 1.0)


def test_the_catalog_feed_merges_only_the_nodes_that_changed_once_its_writes_are_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    st_ = state()
    save = SavedCheckpoint(step=10, generation=1, committed_at=5.0, tiers=["memory"], location="s3://b/10")
    beats = {n: Heartbeat(node=n, generation=1, sent_at=5.0, workers=[], checkpoints=[save]) for n in NODES}
    log = list(NODES)
    feed = catalog.CatalogFeed()
    plan = Plan(st_, 1, 6.0)
    feed.update(plan, observe(6.0, st_, beats, BeatChanges(log, 0, len(log))), 3, JOB)
    assert len(plan.puts) == 1
    entry = next(iter(plan.puts.values()))
    assert isinstance(entry, CheckpointEntry)
    merged: list[str | None] = []
    original = catalog.reconcile

    def counting(current: Any, saves: Any, keep_last: int, bound: int | None = None) -> catalog.CatalogChange:
        listed = list(saves)
        merged.extend(s.location for s in listed)
        return original(current, listed, keep_last, bound)

    monkeypatch.setattr(catalog, "reconcile", counting)
    log.append("node-3")
    lagging = Plan(st_, 1, 7.0)
    feed.update(lagging, observe(7.0, st_, beats, BeatChanges(log, 0, len(log)), {}), 3, JOB)
    assert len(merged) == len(NODES)  # the catalog lacks what was written (not committed yet): every node
    merged.clear()
    log.append("node-1")
    again = Plan(st_, 1, 8.0)
    feed.update(again, observe(8.0, st_, beats, BeatChanges(log, 0, len(log)), {10: entry}), 3, JOB)
    assert merged == ["s3://b/10"] and again.puts == {}  # one node's saves, nothing new to write
