"""The machine reading `make test` prints: a core's speed before the run, the cores' use over it."""

from __future__ import annotations

import pytest
from support.machine import CpuTimes, probe_seconds

BEFORE = "cpu  1000 100 300 5000 50 0 20 200 0 0\ncpu0 1 2 3\n"
AFTER = "cpu  1600 150 400 5200 60 0 30 300 0 0\ncpu0 1 2 3\n"


def test_the_cores_time_splits_into_busy_idle_and_stolen() -> None:
    delta = CpuTimes.parse(AFTER, 100).since(CpuTimes.parse(BEFORE, 100))
    assert (delta.busy, delta.idle, delta.steal) == pytest.approx((7.6, 2.1, 1.0))  # ticks of 1/100 s
    assert delta.describe() == "8 CPU-seconds, the cores 71% busy, 9% taken by the host (1 s of steal)"


def test_a_kernel_without_a_steal_field_reads_as_none_stolen() -> None:
    assert CpuTimes.parse("cpu  100 0 100 800\n", 100).steal == 0.0


def test_the_probe_measures_a_fixed_piece_of_work() -> None:
    assert probe_seconds(1000) > 0
