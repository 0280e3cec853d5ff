"""Detectors that keep a digest per node (issue 42): a tick redoes only the nodes whose heartbeat
changed, and decides what a walk over every worker would have decided, order included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from support.controller_harness import JOB, heartbeats_only, spec_document, worker

from stalwart.controller.core.detectors.base import View
from stalwart.controller.core.detectors.hangs import Hangs
from stalwart.controller.core.detectors.loss_spikes import LossSpikes
from stalwart.controller.core.detectors.node_digests import FailureWatch, NodeDigests
from stalwart.controller.core.observation import BeatChanges, Observation
from stalwart.controller.core.work import StackDiagnosis
from stalwart.diagnosis.log_classify import SYMPTOMS
from stalwart.spec import parse_job
from stalwart.store.records import Heartbeat, JobStage, JobState, LogMatch, WorkerStatus

NODES = [f"node-{i}" for i in range(6)]
SPEC = parse_job(spec_document(roles=[{"name": "trainer", "replicas": 6, "processesPerNode": 2, "command": ["x"]}]))
SYMPTOM = sorted(SYMPTOMS)[0]


def state(generation: int = 1) -> JobState:
    return JobState(
        job=JOB,
        stage=JobStage.RUNNING,
        generation=generation,
        slots=NODES,
        generation_started_at=0.0,
        created_at=0.0,
        updated_at=0.0,
    )


def observe(now: float, st_: JobState, beats: dict[str, Heartbeat], changes: BeatChanges | None) -> Observation:
    return heartbeats_only(now, st_, SPEC, beats, changes)


def test_the_change_log_from_a_cursor() -> None:
    log = ["a", "b", "a", "c"]
    changes = BeatChanges(log, start=10, end=14)
    assert changes.since(10) == {"a", "b", "c"}
    assert changes.since(12) == {"a", "c"}
    assert changes.since(14) == set()
    assert changes.since(9) is None  # dropped from the log: anything may have changed
    assert changes.since(15) is None  # a cursor from another log


def test_only_the_nodes_that_changed_are_digested_again() -> None:
    digested: list[int] = []

    def count(workers: object, sent_at: float | None) -> int:
        digested.append(1)
        return 0

    digests: NodeDigests[int] = NodeDigests(count)
    st_ = state()
    beats = {n: Heartbeat(node=n, generation=1, sent_at=0.0, workers=[worker(i)]) for i, n in enumerate(NODES)}
    log: list[str] = []
    digests.update(View.of(observe(1.0, st_, beats, BeatChanges(log, 0, 0)), st_))
    assert len(digested) == len(NODES)  # the first look: every slot
    log += ["node-2", "node-4", "node-2", "standby-9"]
    view = View.of(observe(2.0, st_, beats, BeatChanges(log, 0, len(log))), st_)
    digested.clear()
    digests.update(view)
    assert len(digested) == 2 and digests.changed == {"node-2", "node-4"}
    digests.update(view)  # the same observation again (the core asks twice in a tick): nothing to redo
    assert len(digested) == 2
    digested.clear()
    digests.update(View.of(observe(3.0, st_, beats, None), st_))  # changes not known: every slot
    assert len(digested) == len(NODES)
    digested.clear()
    st2 = state(generation=2)
    digests.update(View.of(observe(4.0, st2, beats, BeatChanges(log, 0, len(log))), st2))
    assert len(digested) == len(NODES)  # a new generation: every slot again


def workers_for(draw: st.DrawFn, node: int, now: float) -> list[WorkerStatus]:
    out = []
    for local in range(2):
        exit_code = draw(st.sampled_from([None, None, None, 0, 1, 137]))
        matched = draw(st.sampled_from([None, now - 1, now - 7]))
        out.append(
            worker(
                2 * node + local,
                exit_code=exit_code,
                at=draw(st.sampled_from([0.0, now - 2, now])),
                **({} if exit_code is None else {"exited_at": draw(st.sampled_from([None, now - 3, now - 1]))}),
                step=draw(st.sampled_from([None, 3, 5])),
                loss=draw(st.sampled_from([None, 1.0, 2.5])),
                step_time=draw(st.sampled_from([None, 0.0, 0.5, 1.5])),
                failure_class=draw(st.sampled_from([None, SYMPTOM, "oom"])),
                matches=[]
                if matched is None
                else [
                    LogMatch(
                        failure_class=SYMPTOM,
                        scope="job",
                        severity="error",
                        line="x",
                        line_number=1,
                        matched_at=matched,
                    )
                ],
            )
        )
    return out


@st.composite
def rounds(draw: st.DrawFn) -> list[tuple[list[int], dict[int, list[WorkerStatus]], int]]:
    """Each round: the nodes whose heartbeat changed, their new workers, the beat's generation."""
    out = []
    for r in range(draw(st.integers(1, 6))):
        now = 10.0 * (r + 1)
        changed = draw(st.lists(st.integers(0, len(NODES) - 1), unique=True, max_size=len(NODES)))
        out.append((changed, {n: workers_for(draw, n, now) for n in changed}, draw(st.sampled_from([1, 1, 1, 0]))))
    return out


@settings(max_examples=60, deadline=None)
@given(rounds())
def test_digests_decide_what_a_walk_over_every_worker_decides(
    plan: list[tuple[list[int], dict[int, list[WorkerStatus]], int]],
) -> None:
    st_ = state()
    beats: dict[str, Heartbeat] = {}
    log: list[str] = []
    watch, hangs, spikes = FailureWatch(), Hangs(), LossSpikes()
    hangs.reset()
    spikes.reset()
    for r, (changed, workers, generation) in enumerate(plan):
        now = 10.0 * (r + 1)
        for n in changed:
            beats[NODES[n]] = Heartbeat(node=NODES[n], generation=generation, sent_at=now, workers=workers[n])
            log.append(NODES[n])
        view = View.of(observe(now, st_, beats, BeatChanges(log, 0, len(log))), st_)
        # The walk, as the view does it over every worker.
        assert watch.crashed(view) == view.crashed()
        assert watch.first_exit(view) == view.first_exit()
        assert watch.peer_trouble(view) == view.peer_trouble()
        running = [w for w in view.workers if w.exit_code is None]
        progress = [w.last_progress_at for w in running if w.last_progress_at is not None]
        any_running, last_progress, steps, newest_report = hangs._pace(view)
        assert any_running == bool(running)
        assert last_progress == (max(progress) if progress else None)
        assert sorted(steps) == sorted(w.step_time for w in running if w.step_time)
        reporting_nodes = [
            b.sent_at
            for n in NODES
            if (b := beats.get(n)) and b.generation == 1 and any(w.exit_code is None for w in b.workers)
        ]
        assert newest_report == (max(reporting_nodes) if reporting_nodes else None)
        reporting = [w for w in view.workers if w.loss is not None and w.step is not None]
        spikes.observe(view)
        assert spikes._first == (min(reporting, key=lambda w: w.rank, default=None),)


BIG = parse_job(
    spec_document(
        roles=[{"name": "trainer", "replicas": 10_000, "processesPerNode": 1, "command": ["x"]}],
        faultTolerance={"hangTimeoutFloorSeconds": 10, "hangTimeoutMultiplier": 10},
    )
)


def _big_job_at(now: float, reported: dict[str, float]) -> View:
    """A 10,000-node job (progress written every 20 s), three of its slots: each node's ranks last
    progressed at 0; `reported`: when each node's heartbeat saying so was sent."""
    st_ = state()
    beats = {
        n: Heartbeat(node=n, generation=1, sent_at=at, workers=[worker(i, at=0.0, step_time=0.5)])
        for i, (n, at) in enumerate(reported.items())
    }
    obs = observe(now, st_, beats, None)
    return View.of(Observation(**{**obs.__dict__, "spec": BIG}), st_)


def test_a_big_job_s_hang_is_found_once_a_node_reports_a_whole_timeout_without_progress() -> None:
    """The timeout (10 s here) waits a progress interval longer (20 s at 10,000 nodes) only while no
    node has said, a timeout after the newest progress, that it made none."""
    hangs = Hangs()
    quiet = _big_job_at(12.0, {"node-0": 5.0, "node-1": 6.0, "node-2": 7.0})
    assert hangs.look(quiet).work == []  # progress may be unseen yet: 12 s < 10 s + 19 s
    stuck = _big_job_at(12.0, {"node-0": 5.0, "node-1": 11.0, "node-2": 7.0})
    found = hangs.look(stuck).work  # node-1 said at 11 s that its ranks made no progress since 0 s
    assert len(found) == 1 and isinstance(found[0], StackDiagnosis) and found[0].kind == "hang"


def test_the_controller_s_view_logs_the_nodes_whose_heartbeat_arrived() -> None:
    """Through a real controller tick (the in-memory store's watches deliver at once): each
    observation's log ends with the heartbeats that arrived since the one before."""
    from support.controller_harness import Harness

    h = Harness(roles=[{"name": "trainer", "replicas": 3, "processesPerNode": 2, "command": ["x"]}])
    h.running(slots=("node-0", "node-1", "node-2"))
    h.tick()
    first = h.controller.observer.observe({}, frozenset()).beat_changes
    assert first is not None
    h.beat("node-1", 1, [worker(2, at=h.clock.now)])
    h.beat("node-2", 1, [worker(4, at=h.clock.now)])
    h.lapse("node-0")  # its heartbeat key goes: its last heartbeat is kept, nothing new to digest
    later = h.controller.observer.observe({}, frozenset()).beat_changes
    assert later is not None and later.since(first.end) == {"node-1", "node-2"}
