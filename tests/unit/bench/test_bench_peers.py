"""The peers benchmark's pure parts: reading the audit, a recovery's figures, the report."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "bench_peers.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_peers", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_peers"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def write_rank(folder: Path, rank: int, rows: list[tuple[int, int, float]]) -> None:
    with open(folder / f"rank-{rank}.jsonl", "a") as f:
        for step, pid, t in rows:
            f.write(json.dumps({"step": step, "pid": pid, "t": t, "ids": [step * 10 + rank]}) + "\n")


def test_a_restarted_rank_that_resumes_from_a_checkpoint_redoes_the_steps_since(
    bench: ModuleType, tmp_path: Path
) -> None:
    # Rank 1 (pid 11) dies after step 5 at t=5.5; pid 12 resumes at step 4 (a checkpoint at 3) at t=9.
    write_rank(tmp_path, 0, [(s, 10, float(s)) for s in range(1, 6)] + [(s, 20, 5.0 + s) for s in range(4, 8)])
    write_rank(tmp_path, 1, [(s, 11, float(s)) for s in range(1, 6)] + [(s, 12, 5.0 + s) for s in range(4, 8)])
    lines = bench.read_audit(tmp_path)
    rec = bench.recovery(lines, failed_at=5.5, old_pids={10, 11})
    assert rec.first_step == pytest.approx(3.5)
    assert rec.resumed_at == 4
    assert rec.steps_redone == 2  # steps 4 and 5 again
    # The newest attempt of each step wins; the ids equal a clean run's.
    clean = {s: sorted([s * 10, s * 10 + 1]) for s in range(1, 8)}
    assert bench.same_samples(bench.trained(lines), clean)


def test_ranks_never_restarted_give_their_longest_pause(bench: ModuleType, tmp_path: Path) -> None:
    # torchft: rank 0 keeps training (a 2 s gap while the quorum shrinks); rank 1 comes back at step 8.
    write_rank(tmp_path, 0, [(1, 10, 1.0), (2, 10, 2.0), (3, 10, 4.0), (4, 10, 4.5), (8, 10, 8.0)])
    write_rank(tmp_path, 1, [(1, 11, 1.0), (2, 11, 2.0), (8, 12, 8.0)])
    lines = bench.read_audit(tmp_path)
    rec = bench.recovery(lines, failed_at=2.5, old_pids={10, 11})
    assert rec.steps_redone == 0  # it jumped ahead: nothing redone, steps 3-7 of its shard skipped
    assert rec.others_pause == pytest.approx(3.5)
    clean = {s: [s * 10, s * 10 + 1] for s in (1, 2, 3, 4, 8)}
    assert not bench.same_samples(bench.trained(lines), clean)


def test_no_restarted_rank_means_not_recovered(bench: ModuleType, tmp_path: Path) -> None:
    write_rank(tmp_path, 0, [(1, 10, 1.0), (2, 10, 2.0)])
    rec = bench.recovery(bench.read_audit(tmp_path), failed_at=2.5, old_pids={10})
    assert rec.first_step is None and rec.steps_redone is None


def test_the_report_gives_medians_and_says_why_a_cell_is_empty(bench: ModuleType) -> None:
    cells = [
        bench.Cell("stalwart", "kill-worker", 2.0, 1, True, None, [1.0], [1.5]),
        bench.Cell("stalwart", "kill-worker", 4.0, 3, True, None, [1.0], [1.5]),
        bench.Cell("stalwart", "kill-worker", 3.0, 2, True, None, [1.0], [1.5]),
        bench.Cell("torchrun", "hang", None, None, None, None, [2.0], [2.0], "no restarted rank trained within 60s"),
    ]
    table = bench.summarize(cells)
    assert table[("stalwart", "kill-worker")]["first_step"] == 3.0
    assert table[("stalwart", "kill-worker")]["steps_redone"] == 2.0
    context = {
        "command": "python bench/bench_peers.py",
        "measured_at": "2026-01-01 00:00",
        "machine": "m",
        "repeats": 3,
        "systems": ["stalwart", "torchrun", "nvrx"],
        "load_min": 1.0,
        "load_median": 1.5,
        "load_max": 2.0,
        "nvrx_probe": "local checkpoint manager: AssertionError",
    }
    configs = {"stalwart": "s", "torchrun": "t", "nvrx": "n"}
    report = bench.build_report(cells, {"stalwart": [0.01, 0.03]}, context, {("torchrun", "hang"): "x"}, configs)
    assert "| kill-worker | 3.00 s (n=3/3) |" in report
    assert "not recovered (no restarted rank trained within 60s); published: x" in report
    assert "| stalwart | 20.0 ms | 30.0 ms | 2 |" in report
    assert "local checkpoint manager: AssertionError" in report


def test_the_acceptance_lines_give_ratios_against_the_best_peer(bench: ModuleType) -> None:
    cells = [
        bench.Cell("stalwart", "lost-node", 2.0),
        bench.Cell("dlrover", "lost-node", 5.0),
        bench.Cell("torchft", "lost-node", 3.0),
        bench.Cell("stalwart", "kill-worker", 4.0),
        bench.Cell("torchrun", "kill-worker", 2.0),
    ]
    lines = bench.acceptance(bench.summarize(cells), {"stalwart": [0.001], "dlrover": [0.002]}, list(bench.SYSTEMS))
    assert "- lost-node: Stalwart 2.00 s, best peer torchft 3.00 s: 1.5x faster (does not hold: bound 2x)" in lines
    assert "- kill-worker: Stalwart 4.00 s, best peer torchrun 2.00 s: 0.5x faster (does not hold: bound 1x)" in lines
    assert any(line.startswith("- hang: no ratio") for line in lines)
    assert "Stalwart 1.0 ms, DLRover 2.0 ms: 2.0x (holds" in lines[-1]


def test_merged_passes_keep_every_cell_and_the_newest_blocked_times(bench: ModuleType) -> None:
    def run(system: str, blocked: list[float], load: float) -> dict[str, object]:
        context = {
            "command": f"c-{system}",
            "measured_at": "t",
            "repeats": 1,
            "systems": [system],
            "load_min": load,
            "load_max": load,
            "load_median": load,
        }
        cell = {"system": system, "fault": "hang", "first_step": 1.0}
        return {"context": context, "cells": [cell], "blocked": {"stalwart": blocked}}

    cells, blocked, context = bench.merge_runs([run("stalwart", [0.5], 1.0), run("dlrover", [0.1], 3.0)])
    assert [(c.system, c.pass_index) for c in cells] == [("stalwart", 0), ("dlrover", 1)]
    assert blocked == {"stalwart": [0.1]}
    assert (context["load_min"], context["load_max"]) == (1.0, 3.0)


def test_stop_at_takes_hh_mm_and_names_a_bad_value(bench: ModuleType) -> None:
    assert bench._utc_today("00:00") % 60 == 0
    with pytest.raises(SystemExit, match="--stop-at '7pm'"):
        bench._utc_today("7pm")


def test_stalwart_phases_split_the_recovery_and_count_each_check_request_once(
    bench: ModuleType, tmp_path: Path
) -> None:
    # Two nodes run their shares of one check request at once (the slower one counts); a check before
    # the fault (a pre-flight) does not.
    for node, seconds in (("node-0", 1.5), ("node-1", 2.0)):
        log = tmp_path / "nodes" / node / "agent.log"
        log.parent.mkdir(parents=True)
        rows = [
            {"ts": 5.0, "msg": "node checks done", "request": "chk-pre", "seconds": 9.0},
            {"ts": 101.0, "msg": "agent state"},
            {"ts": 103.0, "msg": "node checks done", "request": "chk-a", "seconds": seconds},
        ]
        log.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    incident = {"detected_at": 100.5, "restarted_at": 103.5, "first_step_at": 104.0}
    phases = bench.stalwart_phases(incident, 100.0, tmp_path)
    assert phases == {"detected": 0.5, "restarted": 3.5, "first_step": 4.0, "checks": 2.0}
    cells = [bench.Cell("stalwart", "kill-worker", 4.0, phases=phases), bench.Cell("stalwart", "hang", None)]
    table = bench.stalwart_phase_table(cells)
    assert "| kill-worker | 0.50 s | 3.50 s | 4.00 s | 2.00 s | 1 |" in table
    assert not any(line.startswith("| hang") for line in table)  # a run that recorded no incident


def test_a_run_removes_only_the_flash_checkpoints_it_left(bench: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "standalone_1_ckpt_shm_0").write_bytes(b"older run")
    (tmp_path / "stalwart-dl.job.node-0").write_bytes(b"someone else's")
    before = bench.flash_checkpoints(tmp_path)
    (tmp_path / "standalone_2_ckpt_shm_0").write_bytes(b"this run")
    bench.remove_new_flash_checkpoints(before, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stalwart-dl.job.node-0", "standalone_1_ckpt_shm_0"]
