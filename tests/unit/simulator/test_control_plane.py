"""The control plane's figures at scale (docs/control-plane-scale.json) in the ETTR simulator:
which run, which sizes, interpolation, fallbacks, and where they are added."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stalwart.simulator.control_plane import CONTROL_PLANE_PATH, interpolate, load_control_plane
from stalwart.simulator.measured import DEFAULTS
from stalwart.simulator.rates import Detection, default_classes
from stalwart.simulator.report import markdown
from stalwart.simulator.run import run_default
from stalwart.simulator.scaling import JobModel
from stalwart.simulator.strategies import byterobust_like, requeue, stalwart

JOB = JobModel()
CLASSES = default_classes()


def _size(nodes: int, decision: float | None, beyond: float | None, tick: float | None) -> dict[str, Any]:
    """One size's entry as bench/bench_control_plane.py writes it (the fields read here)."""
    phases: dict[str, Any] = {
        "steady": {
            "job_phase": "Running" if tick is not None else "Pending",
            "controller": {"tick_p50_s": tick if tick is not None else 3.3, "tick_p99_s": 2 * (tick or 3.3)},
        }
    }
    if decision is not None:
        phases["kill"] = {"completed": True, "expiry_to_decision_s": decision, "kill_to_decision_s": decision + 5}
    else:
        phases["kill"] = {"completed": False, "expiry_to_decision_s": None}
    if beyond is not None:
        phases["hang"] = {"completed": True, "beyond_timeout_s": beyond}
    return {"nodes": nodes, "phases": phases}


def _write(path: Path, runs: dict[str, tuple[str, list[dict[str, Any]]]]) -> Path:
    path.write_text(json.dumps({"runs": {k: {"label": k, "when": w, "sizes": s} for k, (w, s) in runs.items()}}))
    return path


def test_interpolation_between_measured_sizes_and_where_it_stops() -> None:
    points = {250: 2.0, 1000: 0.5, 3000: 0.9, 10000: None}
    assert interpolate(points, 1000) == (0.5, "measured at 1,000 nodes")
    value, how = interpolate(points, 1200)
    assert value == pytest.approx(0.5 + 0.4 * 200 / 2000) and how == "interpolated between 1,000 and 3,000 nodes"
    assert interpolate(points, 100) == (2.0, "the smallest measured size's (250 nodes)")
    assert interpolate(points, 5000) == (None, "failed at 10,000 nodes")
    assert interpolate(points, 10000) == (None, "failed at 10,000 nodes")
    assert interpolate(points, 20000) == (None, "not measured at or above 20,000 nodes (largest size 10,000)")
    assert interpolate({}, 1200) == (None, "not measured")


def test_the_newest_run_at_the_job_s_size(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "cp.json",
        {
            "before": ("2026-11-23 23:00:54 UTC", [_size(250, 1.9, 0.05, 0.47), _size(1000, None, None, None)]),
            "after": (
                "2026-11-24 10:30:00 UTC",
                [_size(1000, 0.2, 0.3, 0.01), _size(3000, 0.4, 0.7, 0.05), _size(10000, None, 1.5, None)],
            ),
        },
    )
    cp = load_control_plane(path, nodes=JOB.nodes)
    assert cp.label == "after" and cp.nodes == 1200
    assert cp.lease_decision_seconds == pytest.approx(0.22)
    assert cp.hang_beyond_timeout_seconds == pytest.approx(0.34)
    assert cp.tick_p50_seconds == pytest.approx(0.014) and cp.tick_p99_seconds == pytest.approx(0.028)
    assert cp.notes["lease_decision_seconds"] == "interpolated between 1,000 and 3,000 nodes (label after)"
    # At 5,000 nodes the kill failed next to it: the small-job figures, and the note says why.
    big = load_control_plane(path, nodes=5000)
    assert (
        big.lease_decision_seconds == 0.0
        and "failed at 10,000 nodes (label after)" in big.notes["lease_decision_seconds"]
    )
    assert "small-job figures" in big.notes["lease_decision_seconds"]
    assert big.hang_beyond_timeout_seconds == pytest.approx(0.7 + 0.8 * 2000 / 7000)
    assert big.tick_p50_seconds is None  # the job never ran at 10,000: no steady tick there
    # A run named explicitly; its 1,000-node size never started, and 1,200 is above it.
    before = load_control_plane(path, nodes=JOB.nodes, label="before")
    assert before.label == "before" and before.lease_decision_seconds == 0.0
    assert before.notes["lease_decision_seconds"].startswith("not measured at or above 1,200 nodes")


def test_missing_file_or_label_falls_back_to_the_small_job_figures(tmp_path: Path) -> None:
    cp = load_control_plane(tmp_path / "none.json", nodes=1200)
    assert (cp.lease_decision_seconds, cp.hang_beyond_timeout_seconds, cp.tick_p50_seconds) == (0.0, 0.0, None)
    assert all("no none.json" in note for note in cp.notes.values())
    path = _write(tmp_path / "cp.json", {"before": ("2026-11-23", [_size(250, 1.9, 0.05, 0.47)])})
    unknown = load_control_plane(path, nodes=1200, label="after")
    assert unknown.lease_decision_seconds == 0.0 and "no run labelled 'after'" in unknown.notes["tick_p50_seconds"]
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not the scale harness's output"):
        load_control_plane(tmp_path / "bad.json", nodes=1200)


def test_the_figures_are_added_to_the_classes_they_govern(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "cp.json", {"after": ("2026-11-24", [_size(1000, 0.2, 0.3, 0.01), _size(3000, 0.4, 0.7, 0.05)])}
    )
    cp = load_control_plane(path, nodes=JOB.nodes)
    plain, scaled = stalwart(DEFAULTS, JOB, CLASSES), stalwart(DEFAULTS, JOB, CLASSES, control_plane=cp)
    assert scaled.detect_seconds[Detection.LEASE] == pytest.approx(plain.detect_seconds[Detection.LEASE] + 0.22)
    assert scaled.detect_seconds[Detection.HANG] == pytest.approx(100.0 + 0.34)
    for untouched in (Detection.CRASH, Detection.MACHINE, Detection.NAN, Detection.SLOW):
        assert scaled.detect_seconds[untouched] == plain.detect_seconds[untouched]
    # ByteRobust-like shares Stalwart's lease handling, not its hang detection; requeue neither.
    br = byterobust_like(DEFAULTS, JOB, CLASSES, control_plane=cp)
    assert br.detect_seconds[Detection.LEASE] == scaled.detect_seconds[Detection.LEASE]
    assert br.detect_seconds[Detection.HANG] == 600.0
    assert requeue(DEFAULTS, JOB, CLASSES).detect_seconds[Detection.LEASE] == 340.0
    # The report says what was added and how it was had.
    text = markdown(run_default(range(1), measured=DEFAULTS, control_plane=cp), "test")
    assert "| control plane at 1,200 nodes | label `after` |" in text
    assert "| + lease expiry to eviction decision (added to lost-node detection) | 0.22 s | interpolated" in text


def test_the_harness_s_own_file_loads() -> None:
    if not CONTROL_PLANE_PATH.is_file():
        pytest.skip("docs/control-plane-scale.json is not there")
    cp = load_control_plane(nodes=JOB.nodes)
    assert cp.label is not None and set(cp.notes) == {
        "lease_decision_seconds",
        "hang_beyond_timeout_seconds",
        "tick_p50_seconds",
        "tick_p99_seconds",
    }


def test_a_newer_run_of_one_size_does_not_hide_the_run_that_spans_the_job(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "cp.json",
        {
            "after": ("2026-11-24 10:30:00 UTC", [_size(1000, 0.2, 0.3, 0.01), _size(3000, 0.4, 0.7, 0.05)]),
            "one-size": ("2026-11-29 05:00:00 UTC", [_size(1000, 0.1, 0.2, 0.01)]),
        },
    )
    assert load_control_plane(path, nodes=JOB.nodes).label == "after"
    assert load_control_plane(path, nodes=1000).label == "one-size"  # it spans 1,000 itself: the newest
