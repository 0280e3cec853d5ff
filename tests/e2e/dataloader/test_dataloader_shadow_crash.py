"""The shadow loader under real trainers: two gloo processes train through two loader crashes.

(Moved from the unit tests: a multi-rank torch.distributed world is end-to-end by this suite's
layout, docs/testing.md.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from support.dataloader import Trainers, committed_steps, journal

from stalwart.dataloader import ShadowLoaderSupervisor, global_ids
from stalwart.dataloader.shm_layout import H
from stalwart.processes import wait_for


def test_loader_crashes_change_no_sample_and_fail_no_step(
    supervisor: ShadowLoaderSupervisor,
    tmp_path: Path,
    trainers: list[Trainers],
) -> None:
    """Acceptance: SIGKILL the loader process twice under 2 gloo trainers that wait for it (no local
    fallback): the supervisor restarts it, and every step trains on exactly the clean run's samples."""
    run = tmp_path / "run"
    job = Trainers(
        run,
        supervisor.config,
        world=2,
        micro_batch=4,
        steps=30,
        shm=supervisor.name,
        extra=["--no-fallback", "--pause-at", "8", "--pause-at", "19"],
    )
    trainers.append(job)
    for step in (8, 19):
        job.wait_paused(step)
        victim = supervisor.loader_pid
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        (run / f"go-{step}").touch()  # the trainers run on at once, into the outage
        assert wait_for(lambda dead=victim: supervisor.loader_pid not in (None, dead), 30)
    assert job.wait() == [0, 0], job.logs()
    assert supervisor.restarts == 2
    assert int(supervisor.segment.header[H.INCARNATION]) == 3  # type: ignore[union-attr]
    lines = journal(run)
    assert [line["step"] for line in lines] == list(range(1, 31))  # every step once, none failed
    assert all(line["served_by"] == "shadow" for line in lines)
    clean = global_ids(supervisor.config, 0, 30 * 8).reshape(30, 8).tolist()
    assert [line["ids"] for line in lines] == clean
    assert [committed_steps(run)[s] for s in range(1, 31)] == clean
