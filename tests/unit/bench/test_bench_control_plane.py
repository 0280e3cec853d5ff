"""The control-plane benchmark's verdict: each figure against its bound, with the load it was
measured at, and no comparison with a baseline measured in another load band."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "bench_control_plane.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_control_plane", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_control_plane"] = module
    spec.loader.exec_module(module)
    return module


def size(load: float, tick_p99: float = 0.2, decision: float = 0.05, hang: float = 1.0, **exits: int) -> dict[str, Any]:
    """One size's entry as the bench writes it (the fields the verdict reads)."""
    return {
        "nodes": 1000,
        "phases": {
            "startup": {"completed": True, "nodes": {"exits": {}}, "load": [load, 1.0, 1.0]},
            "steady": {
                "load_before": [load, 1.0, 1.0],
                "load_after": [load, 1.0, 1.0],
                "job_phase": "Running",
                "controller": {"tick_p99_s": tick_p99},
            },
            "kill": {"completed": True, "expiry_to_decision_s": decision, "load": [load, 1.0, 1.0]},
            "hang": {"completed": True, "beyond_timeout_s": hang, "load": [load, 1.0, 1.0]},
        },
        "exits_after_startup": {k.replace("_", " "): v for k, v in exits.items()},
    }


def run(bench: ModuleType, label: str, *sizes: dict[str, Any]) -> dict[str, Any]:
    out = {"label": label, "machine": {"cpus": 2}, "sizes": list(sizes)}
    for s in out["sizes"]:
        s["figures"] = bench.figures(s)
    return out


def test_every_figure_within_its_bound_holds(bench: ModuleType) -> None:
    assert bench.verdict(run(bench, "now", size(1.0))) == []


def test_a_figure_over_its_bound_is_named_with_the_load(bench: ModuleType) -> None:
    broken = bench.verdict(run(bench, "now", size(1.0, tick_p99=1.9, crashed_applying_RUN_DEADLINE_EXCEEDED=3)))
    assert len(broken) == 2
    assert "tick p99" in broken[0] and "1.9" in broken[0] and "load 1.0, quiet" in broken[0]
    assert "timed out" in broken[1] and "= 3" in broken[1]


def test_a_phase_that_never_got_there_breaks_its_bound(bench: ModuleType) -> None:
    s = size(1.0)
    del s["phases"]["hang"]
    assert bench.verdict(run(bench, "now", s)) == [
        "1000 nodes: hang found beyond its timeout (s) not measured (the phase did not complete)"
    ]


def test_no_generation_start_no_agent_timeout_figure(bench: ModuleType) -> None:
    s = size(1.0)
    s["phases"]["startup"]["completed"] = False
    assert bench.figures(s)["agent_timeouts"] is None


def test_an_assignment_read_that_timed_out_counts_though_the_agent_read_again(bench: ModuleType) -> None:
    """The agent keeps a command whose assignment read timed out and reads again (it does not die):
    the read timed out all the same, and the bound says so."""
    s = size(1.0)
    s["phases"]["startup"]["nodes"]["read_timeouts"] = {"range assignment: DEADLINE_EXCEEDED": 2}
    s["read_timeouts_after_startup"] = {"range assignment: DEADLINE_EXCEEDED": 3}
    assert bench.figures(s)["agent_timeouts"] == 5.0
    assert any("assignment" in line for line in bench.verdict(run(bench, "now", s)))


def test_load_bands_per_core(bench: ModuleType) -> None:
    assert [bench.load_band(x, 2) for x in (0.5, 2.9, 3.0, 7.9, 8.0, None)] == [
        "quiet",
        "quiet",
        "busy",
        "busy",
        "overloaded",
        "unknown",
    ]


def test_a_baseline_from_another_load_band_is_refused(bench: ModuleType) -> None:
    ratios, refused = bench.compare(run(bench, "now", size(9.0)), run(bench, "base", size(1.0)))
    assert ratios == []
    assert len(refused) == 1 and "load 9.0 (overloaded)" in refused[0] and "load 1.0 (quiet)" in refused[0]


def test_a_baseline_in_the_same_band_gives_ratios(bench: ModuleType) -> None:
    ratios, refused = bench.compare(run(bench, "now", size(1.0, tick_p99=0.4)), run(bench, "base", size(2.0)))
    assert refused == []
    assert "controller tick p99 (s) 0.4 vs 0.2 (2.00x the baseline)" in ratios[0]


def test_the_command_line_refuses_and_fails_loudly(bench: ModuleType, tmp_path: Path) -> None:
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"runs": {"base": run(bench, "base", size(1.0))}}))
    assert bench.read_baseline(f"{results}:base")["label"] == "base"
    assert bench.read_baseline(str(results))["label"] == "base"
    with pytest.raises(SystemExit, match="no run labelled 'other'"):
        bench.read_baseline(f"{results}:other")
    with pytest.raises(SystemExit, match="cannot read a results file"):
        bench.read_baseline(str(tmp_path / "missing.json"))
