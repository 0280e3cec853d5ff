"""`make test`'s lanes (tests/support/suite.py): every test runs in exactly one of them."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO


@pytest.fixture
def suite(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "tests" / "support"))  # as when make runs it as a script
    return importlib.import_module("suite")


def lanes(suite: ModuleType, tmp_path: Path, record: Path | None = None) -> dict[str, list[str]]:
    args = argparse.Namespace(workers=2, e2e_workers=2, nice=10, logs=tmp_path, record_durations=record)
    background, e2e = suite.phases(args)
    return {phase.name: phase.argv for phase in [*background, e2e]}


def test_the_late_modules_exist_and_run_in_the_late_lane_only(suite: ModuleType, tmp_path: Path) -> None:
    assert suite.LATE and all((REPO / path).is_file() and path.startswith("tests/e2e/") for path in suite.LATE)
    argv = lanes(suite, tmp_path)
    e2e = argv["end-to-end tests"]
    late = argv["end-to-end tests that wait (the late lane)"]
    assert "tests/e2e" in e2e and {a.removeprefix("--ignore=") for a in e2e if a.startswith("--ignore=")} == set(
        suite.LATE
    )
    assert [a for a in late if a.startswith("tests/")] == list(suite.LATE) and "-n" not in late


def test_the_late_lane_starts_after_the_unit_tests(suite: ModuleType, tmp_path: Path) -> None:
    args = argparse.Namespace(workers=2, e2e_workers=2, nice=10, logs=tmp_path, record_durations=None)
    background, e2e = suite.phases(args)
    by_name = {phase.name: phase for phase in background}
    assert by_name["end-to-end tests that wait (the late lane)"].after is by_name["unit tests"]
    assert e2e.after is None and by_name["unit tests"].after is None


def test_every_pytest_lane_records_its_durations(suite: ModuleType, tmp_path: Path) -> None:
    record = tmp_path / "durations.json"
    pytest_lanes = [argv for argv in lanes(suite, tmp_path, record).values() if "pytest" in argv]
    assert len(pytest_lanes) == 3
    assert all(argv[argv.index("--record-durations") + 1] == str(record) for argv in pytest_lanes)


def test_stopping_a_lane_that_never_started_does_nothing(suite: ModuleType, tmp_path: Path) -> None:
    args = argparse.Namespace(workers=2, e2e_workers=2, nice=10, logs=tmp_path, record_durations=None)
    background, _ = suite.phases(args)
    late = background[-1]
    late.stop()  # an interrupt before the unit tests ended
    assert late.proc is None and late.ended is None
