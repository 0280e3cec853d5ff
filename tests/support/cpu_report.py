"""Which tests cost the machine's CPU: a pytest plugin that records, per test, its wall time and the
CPU time the whole machine spent meanwhile (every process the test started included, since most of
an end-to-end test's work is in its jobs' processes, not in pytest's).

    .venv/bin/python -m pytest tests/e2e -p support.cpu_report

It writes .stalwart/cpu-report.json (`[[test id, wall seconds, CPU seconds], ...]`) and prints the
tests that cost the most. The CPU figure is the machine's, so it is a test's own only when the
tests run one at a time (no -n) on an otherwise quiet machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from support.machine import CpuTimes

REPORT = Path(".stalwart/cpu-report.json")
SHOWN = 15

_rows: list[tuple[str, float, float]] = []


def machine_cpu_seconds() -> float:
    """CPU time every core has spent busy since boot, the host's steal included."""
    times = CpuTimes.now()
    return times.busy + times.steal if times is not None else 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    cpu, wall = machine_cpu_seconds(), time.monotonic()
    yield
    _rows.append((item.nodeid, time.monotonic() - wall, machine_cpu_seconds() - cpu))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _rows:
        return
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(_rows, indent=0))
    wall, cpu = sum(r[1] for r in _rows), sum(r[2] for r in _rows)
    terminalreporter.section("CPU per test (the machine's, while the test ran)")
    terminalreporter.write_line(f"{len(_rows)} tests: {wall:.0f} s of wall time, {cpu:.0f} CPU-seconds; in {REPORT}")
    for nodeid, seconds, used in sorted(_rows, key=lambda r: -r[2])[:SHOWN]:
        terminalreporter.write_line(f"{used:7.1f} CPU-s {seconds:7.1f} s  {nodeid}")
