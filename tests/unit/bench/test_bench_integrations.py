"""bench/bench_integrations.py's arithmetic and report, on a run folder laid out as `stalwart run` leaves it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.paths import REPO

sys.path.insert(0, str(REPO / "bench"))
import bench_integrations as bench


def run_folder(tmp_path: Path, name: str, wall: float, cpu: float, hooks: dict[str, float] | None) -> Path:
    """A run folder whose rank 0 printed STEP_TIMES for 41 steps (the first 20 are warm-up and the last
    holds the final checkpoint, both made slow)."""
    log = tmp_path / name / "nodes" / "node-0" / "gen-1" / "rank-0.log"
    log.parent.mkdir(parents=True)
    walls = [9.0] * bench.WARMUP_STEPS + [wall] * 20 + [9.0]
    cpus = [9.0] * bench.WARMUP_STEPS + [cpu] * 20 + [9.0]
    report = {"stalwart": hooks is not None, "step_times": walls, "cpu_times": cpus, "thread_times": cpus}
    log.write_text("starting\nSTEP_TIMES " + json.dumps({**report, "hooks": hooks}) + "\ndone\n")
    return tmp_path / name


def test_the_pairs_run_in_abba_order() -> None:
    assert bench.abba(3) == [
        (0, "plain"),
        (0, "stalwart"),
        (1, "stalwart"),
        (1, "plain"),
        (2, "plain"),
        (2, "stalwart"),
    ]


def test_a_run_s_figures_leave_the_warm_up_and_the_last_step_out(tmp_path: Path) -> None:
    hooks = {"wall": 1e-4, "cpu": 5e-5, "sender": 2e-5}
    figures = bench.RunFigures.of(bench.step_report(run_folder(tmp_path, "a", 0.030, 0.020, hooks)))
    assert figures.wall == pytest.approx(0.030) and figures.cpu == pytest.approx(0.020)
    assert figures.wall_mean == pytest.approx(0.030)
    assert (figures.hooks_wall, figures.hooks_cpu, figures.sender_cpu) == (1e-4, 5e-5, 2e-5)
    plain = bench.RunFigures.of(bench.step_report(run_folder(tmp_path, "b", 0.030, 0.020, None)))
    assert plain.hooks_wall is None and plain.sender_cpu is None


def test_a_run_without_a_report_is_refused_naming_the_folder(tmp_path: Path) -> None:
    (tmp_path / "nodes").mkdir()
    with pytest.raises(RuntimeError, match="no STEP_TIMES line"):
        bench.step_report(tmp_path)


def test_ratios_are_per_pair_and_reported_with_their_spread() -> None:
    ratios = bench.pair_ratios([0.020, 0.030, 0.025], [0.021, 0.029, 0.025])
    assert ratios == pytest.approx([0.05, -1 / 30, 0.0])
    assert bench.spread(ratios) == "median +0.00%, spread -3.33% .. +5.00% over 3 pair(s)"


def test_the_goal_holds_only_with_its_own_cpu_and_every_pair_s_whole_step_under_one_percent() -> None:
    five_under = [0.002, -0.004, 0.006, 0.001, 0.0]
    held = bench.verdict("x", 0.004, five_under, [0.05, -0.04])
    assert "the 1% goal holds: its own CPU per step is 0.40% of the plain run's" in held
    assert "wall, shown and not judged: median +0.50%, spread -4.00% .. +5.00% over 2 pair(s)" in held
    # The hooks' share under 1% does not carry it alone: the whole step of the pairs must agree.
    assert "does not hold" in bench.verdict("x", 0.004, [0.02, 0.03, 0.015, 0.011, 0.04], [0.0])
    assert "does not hold: its own CPU" in bench.verdict("x", 0.012, five_under, [0.0])
    straddling = bench.verdict("x", 0.004, [0.002, 0.023, 0.006, 0.001, 0.0], [0.0])
    assert "is not decided within this run's noise" in straddling and "median +0.20%" in straddling
    few = bench.verdict("x", 0.004, [0.002, -0.004], [0.0])
    assert "is not decided: 2 pair(s), the verdict needs 5" in few


def test_a_section_shows_each_unit_and_the_notes_under_the_table(tmp_path: Path) -> None:
    rows = [
        bench.Row("x", "hooks", [50e-6, 70e-6], unit="us"),
        bench.Row("x", "ratio", [0.01, -0.02], unit="%"),
        bench.Row("x", "cpu", [0.020], unit="ms"),
        bench.Row("x", "recovery", [1.5, 2.5]),
    ]
    text = bench.section("x", bench.Result(rows, ["Verdict: fine."]), "cmd", "load 1", "load 2")
    assert "| hooks | 60.0 | 50.0, 70.0 |" in text and "| ratio | -0.50% | +1.00%, -2.00% |" in text
    assert "| cpu | 20.00 | 20.00 |" in text and "| recovery | 2.00 | 1.50, 2.50 |" in text
    assert text.rstrip().endswith("Verdict: fine.")
    report = tmp_path / "report.md"
    report.write_text("# old\n\n<!-- integration: other -->\n## other\nkept\n")
    bench.write_report({"x": text}, report)
    assert "## other\nkept" in report.read_text() and "Verdict: fine." in report.read_text()
