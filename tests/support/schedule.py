"""Longest first: under pytest-xdist the work units (the tests that share one run, a module-scoped
fixture: `shared_groups`; or a single test) start in the order of their recorded durations, longest
first, so that the run ends on short tests on both workers instead of one worker finishing a
40-second test while the other idles.

xdist hands each worker the next unit of its queue as it frees up, and builds that queue in the
workers' collection order unless told to reorder it (`--loadscope-reorder`, its default, puts the
units with the most tests first: a module of twelve quick tests before a test of a minute). So this
plugin turns xdist's reordering off and sorts the collection itself, in the workers, by unit:

- a unit's duration is the sum of its tests' durations in tests/durations.json (setup, call and
  teardown, as a recorded run measured them); tests missing from the file count as 0 and keep their
  collection order after the recorded ones;
- the tests of one unit stay together, in their own order (their module-scoped run is set up once).

A serial run (no -n) keeps pytest's order: the order only matters for how the units share workers.

The file is a record, not a contract: `make durations` runs `make test`'s suite and writes it again
(`--record-durations PATH`: this session's tests of at least RECORDED_FROM seconds replace their
entries, tests that took less leave it). A test added without recording starts after every recorded
unit, and a run ends with a line naming the unrecorded tests of UNRECORDED_NOTE_FROM seconds or more:
record those before they land (docs/testing.md).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from support.paths import REPO

T = TypeVar("T")
DURATIONS = REPO / "tests" / "durations.json"
LOCK = REPO / ".stalwart" / "durations.lock"
RECORDED_FROM = 1.0  # seconds: shorter tests change no schedule and would only churn the file
UNRECORDED_NOTE_FROM = 10.0  # seconds: an unrecorded test this long is worth a line at the end of a run
ABOUT = "Recorded test durations in seconds, longest first (tests/support/schedule.py; `make durations`)."


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        type=Path,
        default=None,
        help="merge this session's test durations into PATH (tests/durations.json orders xdist's work)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # the collection's order is the schedule (below)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationRecorder(config.getoption("record_durations")), "duration-recorder")


def recorded(path: Path = DURATIONS) -> dict[str, float]:
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text())
        return {str(k): float(v) for k, v in doc["seconds"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise pytest.UsageError(f"{path}: not a durations record ({exc}); `make durations` writes it again") from exc


def unit_of(item: pytest.Item) -> str:
    """The work unit as xdist's loadgroup sees it: the item's group, or the item alone."""
    group = item.get_closest_marker("xdist_group")
    if group is not None:
        return str(group.args[0] if group.args else group.kwargs.get("name", "default"))
    return plain_nodeid(item.nodeid)


def plain_nodeid(nodeid: str) -> str:
    """xdist's loadgroup appends `@group` to a grouped test's id in the workers. The test's own id
    ends at its name (an identifier) or at its parameters' closing bracket (an `@` may be inside
    them); a group's name may hold `::` (`module::fixture`, `shared_groups`) but no bracket."""
    head, sep, names = nodeid.partition("::")
    name_end = len(head) + len(sep) + min((i for i in (names.find("["), names.find("@")) if i >= 0), default=len(names))
    start = nodeid.rfind("]") + 1 if nodeid.startswith("[", name_end) else name_end
    at = nodeid.find("@", start)
    return nodeid[:at] if at >= 0 else nodeid


@pytest.hookimpl(trylast=True)  # after tests/conftest.py has put each module-scoped run in its group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):
        items[:] = longest_first(items, recorded(), unit_of, lambda item: plain_nodeid(item.nodeid))


def longest_first(
    items: list[T], seconds: dict[str, float], unit: Callable[[T], str], key: Callable[[T], str]
) -> list[T]:
    """The items grouped by unit, the units by their recorded seconds, longest first; unrecorded
    units (0 s) and ties keep their collection order, as do the items within a unit."""
    units: dict[str, list[T]] = {}
    for item in items:
        units.setdefault(unit(item), []).append(item)
    cost = {name: sum(seconds.get(key(i), 0.0) for i in members) for name, members in units.items()}
    return [item for name in sorted(units, key=lambda name: -cost[name]) for item in units[name]]


def shared_groups(keys: list[list[str]]) -> list[str | None]:
    """Each test's xdist group, from the `where::fixture` keys of the module-scoped fixtures it uses:
    tests linked by a fixture, directly or through each other, share a group (one worker sets the
    fixture up once), named after the fixtures; a test with none has no group (None). A module with
    two independent runs (the 3-D layout's faults run and its replay run) is two groups, which two
    workers run at once, not one group that one worker runs in turn."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for item_keys in keys:
        for key in item_keys:
            parent.setdefault(key, key)
        for key in item_keys[1:]:
            parent[root(key)] = root(item_keys[0])
    members: dict[str, list[str]] = {}
    for key in parent:
        members.setdefault(root(key), []).append(key)
    names = {top: _group_name(sorted(group)) for top, group in members.items()}
    return [names[root(item_keys[0])] if item_keys else None for item_keys in keys]


def _group_name(keys: list[str]) -> str:
    """`module::fixture+fixture`, from keys `module::fixture` (a group's keys share their module)."""
    return keys[0].partition("::")[0] + "::" + "+".join(key.partition("::")[2] for key in keys)


def merged(before: dict[str, float], session: dict[str, float]) -> dict[str, float]:
    """The record after a session: its tests of RECORDED_FROM seconds or more replace their entries,
    its shorter ones leave it, tests it did not run keep theirs; longest first."""
    after = dict(before)
    for nodeid, took in session.items():
        if took >= RECORDED_FROM:
            after[nodeid] = round(took, 1)
        else:
            after.pop(nodeid, None)
    return dict(sorted(after.items(), key=lambda kv: (-kv[1], kv[0])))


class DurationRecorder:
    """In the controlling process (xdist's or the only one): sums each test's phases as reported,
    writes them to the record when asked to, and otherwise says which long tests the record lacks."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[plain_nodeid(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.path is None or not self.seconds:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK, "w") as lock:  # `make durations` records two sessions at once
            fcntl.flock(lock, fcntl.LOCK_EX)
            body = {"about": ABOUT, "seconds": merged(recorded(self.path), self.seconds)}
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(body, indent=1) + "\n")
            tmp.replace(self.path)
        kept = sum(1 for took in self.seconds.values() if took >= RECORDED_FROM)
        session.config.get_terminal_writer().line(f"durations of {kept} tests recorded in {self.path}")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.path is not None:
            return
        missing = unrecorded(recorded(), self.seconds)
        if missing:
            terminalreporter.write_line(
                f"not in tests/durations.json, so started after the recorded tests under xdist "
                f"(`make durations` records them): {len(missing)} of {UNRECORDED_NOTE_FROM:.0f} s or more: "
                + ", ".join(missing[:3])
                + (" ..." if len(missing) > 3 else ""),
                yellow=True,
            )


def unrecorded(record: dict[str, float], session: dict[str, float]) -> list[str]:
    """This session's long tests that the record lacks, longest first: they start late."""
    long = [(took, nodeid) for nodeid, took in session.items() if took >= UNRECORDED_NOTE_FROM and nodeid not in record]
    return [nodeid for _, nodeid in sorted(long, reverse=True)]
