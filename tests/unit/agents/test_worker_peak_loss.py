"""A worker's status carries the peak loss of its recent steps: the controller sees one heartbeat in
many steps, and a one-step spike must still reach it."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from stalwart.agents.workers import Worker


def a_worker(tmp_path: Path) -> Worker:
    return Worker(local_rank=0, rank=0, proc=cast(Any, SimpleNamespace(pid=1)), log_path=tmp_path / "rank-0.log")


def test_the_peak_of_the_window_is_kept_and_forgotten_once_older(tmp_path: Path) -> None:
    w = a_worker(tmp_path)
    for step, loss in enumerate([2.0, 2.1, 40.0, 2.0, 1.9], start=10):
        w.note_loss(100.0 + 0.1 * step, step, loss, window=3.0)
    assert (w.status.peak_loss_step, w.status.peak_loss) == (12, 40.0)
    w.note_loss(104.5, 15, 1.8, window=3.0)  # the spike is more than 3 s old
    assert (w.status.peak_loss_step, w.status.peak_loss) == (15, 1.8)


def test_a_missing_or_non_finite_loss_is_no_peak(tmp_path: Path) -> None:
    w = a_worker(tmp_path)
    w.note_loss(1.0, 1, None, window=3.0)
    w.note_loss(1.1, 2, math.nan, window=3.0)
    w.note_loss(1.2, 3, math.inf, window=3.0)
    assert w.status.peak_loss is None and w.status.peak_loss_step is None
    w.note_loss(1.3, 4, 2.5, window=3.0)
    assert (w.status.peak_loss_step, w.status.peak_loss) == (4, 2.5)
