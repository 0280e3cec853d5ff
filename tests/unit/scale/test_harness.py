"""The control-plane scale harness (bench/bench_control_plane.py) runs end to end at a tiny size:
simulated nodes register and step, the real controller decides on a silent node and on a hang,
and every process is gone afterwards. Its figures are the benchmark's business, not this test's."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from support.paths import REPO


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_control_plane", REPO / "bench" / "bench_control_plane.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_harness_runs_a_tiny_cluster_through_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    run = _bench().main(
        [
            "--sizes=6",
            "--procs-per-node=2",
            "--steady=1",
            "--interval=0.5",
            "--ttl=2",
            "--step-time=0.2",
            "--first-step-after=0.2",
            "--hang-floor=1",
            "--hang-multiplier=2",
            "--skip-cli",
            "--sim-procs=1",
            f"--out={out}",
            f"--workdir={tmp_path / 'run'}",
        ]
    )
    size = run["sizes"][0]
    phases = size["phases"]
    assert "error" not in size, size.get("error")
    assert phases["startup"]["completed"], phases["startup"]
    assert phases["steady"]["simulators"]["beats_per_second"] > 0
    assert phases["steady"]["controller"]["ticks"] > 0
    assert phases["kill"]["failure_class"] == "LostNode", phases["kill"]
    assert phases["recovery"]["completed"], phases["recovery"]
    assert phases["hang"]["culprit_found"], phases["hang"]
    assert size["orphans"] == []
    assert out.exists()
