"""The schedule of `make test`'s xdist workers (support.schedule): longest work first, from a record
that each `make durations` run updates."""

from __future__ import annotations

from support.schedule import longest_first, merged, plain_nodeid, shared_groups, unrecorded

SECONDS = {"m.py::a": 3.0, "m.py::b": 4.0, "x.py::long": 30.0, "y.py::mid": 5.0}


def _order(items: list[tuple[str, str]], seconds: dict[str, float]) -> list[str]:
    return [nodeid for nodeid, _ in longest_first(items, seconds, lambda i: i[1], lambda i: i[0])]


def test_units_go_longest_first_and_a_units_tests_stay_together_in_their_order() -> None:
    items = [("m.py::a", "m.py"), ("y.py::mid", "y.py::mid"), ("m.py::b", "m.py"), ("x.py::long", "x.py::long")]
    # x (30 s) before the module m (its two tests, 7 s) before y (5 s); m's tests in collection order.
    assert _order(items, SECONDS) == ["x.py::long", "m.py::a", "m.py::b", "y.py::mid"]


def test_unrecorded_tests_come_after_the_recorded_ones_in_collection_order() -> None:
    items = [("new.py::z", "new.py::z"), ("y.py::mid", "y.py::mid"), ("new.py::a", "new.py::a")]
    assert _order(items, SECONDS) == ["y.py::mid", "new.py::z", "new.py::a"]
    assert _order(items, {}) == ["new.py::z", "y.py::mid", "new.py::a"]  # no record: pytest's order


def test_a_session_replaces_its_tests_entries_and_drops_the_ones_now_short() -> None:
    after = merged(SECONDS, {"m.py::a": 12.34, "y.py::mid": 0.2, "n.py::new": 1.0, "n.py::quick": 0.9})
    assert after == {"x.py::long": 30.0, "m.py::a": 12.3, "m.py::b": 4.0, "n.py::new": 1.0}
    assert list(after) == ["x.py::long", "m.py::a", "m.py::b", "n.py::new"]  # longest first


def test_the_group_suffix_xdist_gives_a_grouped_test_is_not_part_of_its_id() -> None:
    assert plain_nodeid("tests/e2e/a.py::test_x@tests/e2e/a.py") == "tests/e2e/a.py::test_x"
    assert plain_nodeid("tests/e2e/a.py::test_x[p@q]") == "tests/e2e/a.py::test_x[p@q]"
    # shared_groups names a group `module::fixture`: its `::` is not part of the test's id
    assert plain_nodeid("tests/e2e/a.py::test_x@tests/e2e/a.py::run+world") == "tests/e2e/a.py::test_x"
    assert plain_nodeid("tests/e2e/a.py::test_x[p@q]@tests/e2e/a.py::run") == "tests/e2e/a.py::test_x[p@q]"
    assert plain_nodeid("tests/e2e/a.py::TestA::test_x@tests/e2e/a.py::run") == "tests/e2e/a.py::TestA::test_x"


def test_a_run_names_the_long_tests_the_record_lacks_longest_first() -> None:
    session = {"x.py::long": 31.0, "n.py::new": 12.0, "n.py::newer": 40.0, "n.py::short": 2.0}
    assert unrecorded(SECONDS, session) == ["n.py::newer", "n.py::new"]


def test_tests_linked_by_a_module_fixture_share_a_group_and_independent_runs_do_not() -> None:
    keys = [
        ["m.py::faults_run"],
        ["m.py::replay_run"],
        [],
        ["m.py::faults_run"],
        ["n.py::app", "n.py::records"],  # links app's tests with records' tests
        ["n.py::records"],
        ["n.py::app"],
    ]
    assert shared_groups(keys) == [
        "m.py::faults_run",
        "m.py::replay_run",
        None,
        "m.py::faults_run",
        "n.py::app+records",
        "n.py::app+records",
        "n.py::app+records",
    ]


def test_a_chain_of_fixtures_makes_one_group_whatever_the_order() -> None:
    keys = [["m.py::a"], ["m.py::c"], ["m.py::b", "m.py::c"], ["m.py::a", "m.py::b"]]
    assert set(shared_groups(keys)) == {"m.py::a+b+c"}
