"""Acceptance: exact resume after trainer kills, and data-parallel resizing, with real processes and gloo.

What must match a clean run id for id is the sequence of samples of *committed* steps: steps after
the last checkpoint die with the trainer and are trained again after the restart, as in a real job.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.dataloader import Trainers, committed_steps, journal

from stalwart.dataloader import DataConfig, ShadowLoaderSupervisor, global_ids
from stalwart.dataloader.shm_layout import A
from stalwart.processes import wait_for


@pytest.fixture
def supervisor(data_config: DataConfig) -> Iterator[ShadowLoaderSupervisor]:
    with ShadowLoaderSupervisor(
        data_config, job=f"resume-{uuid.uuid4().hex[:8]}", node="node-0", lanes=2, max_micro_batch=4, slots=4
    ) as sup:
        yield sup


def prefilled(sup: ShadowLoaderSupervisor, position: int) -> bool:
    """Every lane was re-armed, unowned, at `position` after its trainer died."""
    lanes = sup.segment.lanes  # type: ignore[union-attr]
    return all(int(ln.ctrl[A.OWNER_PID]) == 0 and int(ln.ctrl[A.POSITION]) == position for ln in lanes)


def test_exact_resume_after_two_trainer_kills(
    supervisor: ShadowLoaderSupervisor,
    tmp_path: Path,
    trainers: list[Trainers],
) -> None:
    """2 gloo ranks with the node's shadow loader; SIGKILL both at step 13 and at step 27 (checkpoints
    every 5 steps), restart each time from the last checkpoint. Committed steps equal a clean run's."""
    run, steps, global_batch = tmp_path / "run", 35, 8
    args = {
        "world": 2,
        "micro_batch": 4,
        "steps": steps,
        "ckpt_every": 5,
        "shm": supervisor.name,
        "extra": ["--pause-at", "13", "--pause-at", "27"],
    }
    for kill_at, resume_step in ((13, 10), (27, 25)):
        job = Trainers(run, supervisor.config, **args)  # type: ignore[arg-type]
        trainers.append(job)
        job.wait_paused(kill_at)
        job.kill()
        # The shadow loader notices the dead trainers and prefills from their last published state.
        assert wait_for(lambda at=resume_step * global_batch: prefilled(supervisor, at), 30), job.logs()
    job = Trainers(run, supervisor.config, **args)  # type: ignore[arg-type]
    trainers.append(job)
    assert job.wait() == [0, 0], job.logs()

    clean = global_ids(supervisor.config, 0, steps * global_batch).reshape(steps, global_batch).tolist()
    committed = committed_steps(run)
    assert sorted(committed) == list(range(1, steps + 1))
    assert [committed[s] for s in range(1, steps + 1)] == clean

    lines = journal(run)
    assert [line["step"] for line in lines] == [*range(1, 14), *range(11, 28), *range(26, 36)]
    for line in lines:  # re-consumed steps saw exactly the samples they saw before the kill
        assert line["ids"] == clean[line["step"] - 1]
        assert line["position"] == (line["step"] - 1) * global_batch
    restarted = [lines[13], lines[13 + 17]]  # the first step of each restarted incarnation
    assert [line["step"] for line in restarted] == [11, 26]
    assert all(line["adopted"] == 1 for line in restarted), "the restarted trainers took the prefilled batches"


@pytest.mark.parametrize("sizes", [(4, 2, 4)], ids=["4-as-2-as-4"])
def test_dp_resize_continues_at_the_exact_next_global_sample(
    data_config: DataConfig,
    tmp_path: Path,
    trainers: list[Trainers],
    sizes: tuple[int, ...],
) -> None:
    """Real gloo jobs: 4 ranks x 4 samples to step 6, resumed as 2 ranks x 8 to step 12 (4 as 2), resumed
    as 4 ranks x 4 to step 16 (2 as 4). The global batch stays 16; the sequence equals a clean run's.
    (More layouts, and a changed global batch, run rank-explicitly in one process in test_dataloader_order.)"""
    run, global_batch = tmp_path / "run", 16
    for world, until in zip(sizes, (6, 12, 16), strict=True):
        job = Trainers(run, data_config, world=world, micro_batch=global_batch // world, steps=until, ckpt_every=3)
        trainers.append(job)
        assert job.wait() == [0] * world, job.logs()
    clean = global_ids(data_config, 0, 16 * global_batch).reshape(16, global_batch).tolist()
    committed = committed_steps(run)
    assert [committed[s] for s in range(1, 17)] == clean
    assert [line["step"] for line in journal(run)] == list(range(1, 17))
