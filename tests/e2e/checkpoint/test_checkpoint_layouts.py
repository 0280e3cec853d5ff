"""Bitwise round trips for every adapter, and the reshard matrix, with real gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO
from support.ranks import run_ranks

WORKER = REPO / "tests" / "data" / "checkpoint" / "ckpt_worker.py"


def all_equal(results: list[dict]) -> bool:  # type: ignore[type-arg]
    return all(all(r["equal"].values()) for r in results)


@pytest.mark.parametrize(("kind", "world"), [("plain", 1), ("ddp", 2), ("fsdp2", 4), ("tp_fsdp2", 4)])
def test_bitwise_round_trip(tmp_path: Path, kind: str, world: int) -> None:
    results = run_ranks(WORKER, ["roundtrip", str(tmp_path), f"kind={kind}"], world, tmp_path)
    assert all(r["differed_before_load"] for r in results), "the fresh model must start different"
    assert all_equal(results), [k for r in results for k, ok in r["equal"].items() if not ok]
    assert results[0]["n"] >= 4  # weights, biases and optimizer moments


def test_megatron_sharded_tensor_round_trip_and_reshard(tmp_path: Path) -> None:
    # Saved by 4 ranks as TP=2 with two replicas of each shard; loaded as TP=4 and as TP=1.
    saved = run_ranks(WORKER, ["megatron", str(tmp_path), "mode=save", "tp=2"], 4, tmp_path)
    per_rank = saved[0]["total_bytes"]
    assert per_rank > 0
    written = [r["bytes_written"] for r in saved]
    assert sum(1 for b in written if b > 64 * 48 * 4 // 4) == 2  # each of the 2 shards written once
    for tp, world in ((4, 4), (1, 1), (2, 2)):
        loaded = run_ranks(WORKER, ["megatron", str(tmp_path), "mode=load", f"tp={tp}"], world, tmp_path)
        assert all_equal(loaded), (tp, world)


@pytest.mark.parametrize(
    ("save_layout", "save_world", "load_layout", "load_world"),
    [
        ("tp2xdp2", 4, "dp4", 4),
        ("tp2xdp2", 4, "dp2", 2),
        ("tp2xdp2", 4, "single", 1),
        ("dp4", 4, "tp2xfsdp2", 4),
    ],
)
def test_reshard_matrix(tmp_path: Path, save_layout: str, save_world: int, load_layout: str, load_world: int) -> None:
    saved = run_ranks(WORKER, ["reshard_save", str(tmp_path), f"layout={save_layout}"], save_world, tmp_path)
    assert all(r["committed"] for r in saved)
    loaded = run_ranks(WORKER, ["reshard_load", str(tmp_path), f"layout={load_layout}"], load_world, tmp_path)
    assert all_equal(loaded), loaded
    assert all(r["step"] == 10 and r["meta"] == {"note": "hello", "step": 11} for r in loaded)


def test_replicated_shards_are_written_once_and_spread(tmp_path: Path) -> None:
    saved = run_ranks(WORKER, ["reshard_save", str(tmp_path), "layout=rep"], 4, tmp_path)
    total = saved[0]["total_bytes"]
    written = [r["bytes_written"] for r in saved]
    assert sum(written) == total  # once each, not four times
    assert sum(written) < 4 * max(written)  # more than one rank shares the work
