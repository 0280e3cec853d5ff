"""The run summary's final loss is rank 0's loss at the last step (issue 15): the state's step and
loss are kept as a pair, so a step persisted before rank 0 reported its loss for it does not keep
the older loss."""

from __future__ import annotations

from typing import Any

from support.controller_harness import JOB, Harness
from support.controller_harness import worker as _worker

from stalwart.runner.summary import snapshot


def worker(rank: int, **fields: Any) -> Any:
    return _worker(rank, first_step=1, first_step_at=0.0, **fields)


def test_the_final_loss_is_rank_0s_loss_at_the_last_step() -> None:
    h = Harness()
    h.running()
    h.clock.advance(10)  # past the progress persistence interval
    h.beat("node-0", 1, [worker(0, step=59, loss=1.40), worker(1, step=60, loss=1.41)])
    h.beat("node-1", 1, [worker(2, step=60, loss=1.42), worker(3, step=60, loss=1.43)])
    h.tick()
    assert (h.state().last_step, h.state().last_loss) == (60, 1.40)  # rank 0 is a step behind here
    h.beat("node-0", 1, [worker(0, step=60, exit_code=0, loss=1.26), worker(1, step=60, exit_code=0, loss=1.27)])
    h.beat("node-1", 1, [worker(r, step=60, exit_code=0, loss=1.3) for r in (2, 3)])
    h.tick()
    state = h.state()
    assert state.reason == "Completed" and (state.last_step, state.last_loss) == (60, 1.26)
    for node in ("node-0", "node-1"):
        h.lapse(node)  # the agents are gone when the summary is printed
    summary = snapshot(h.store, JOB, now=h.clock.now)  # type: ignore[arg-type]
    assert summary is not None and (summary.step, summary.loss) == (60, 1.26)


def test_the_step_is_copied_every_few_seconds_even_when_the_state_is_written_more_often() -> None:
    """Timed from the last copy, not from the state's last write: a state rewritten every second for other
    reasons (pool upkeep, a catalog entry) still gets the step, so `stalwart jobs` does not stall on it."""
    from stalwart.controller.core.decision import Plan
    from stalwart.controller.core.progress import PROGRESS_PERSIST_SECONDS, note_progress
    from stalwart.store.records import JobState

    state = JobState(job=JOB, created_at=0.0, updated_at=0.0)
    now, step = 100.0, 1
    for _ in range(int(3 * PROGRESS_PERSIST_SECONDS)):
        state.updated_at = now - 1  # written a second ago, for something else
        plan = Plan(state, 1, now)
        note_progress(plan, [worker(0, step=step, loss=1.0)])
        state, now, step = plan.state, now + 1, step + 1
    assert state.last_step is not None and state.last_step >= step - 1 - PROGRESS_PERSIST_SECONDS
