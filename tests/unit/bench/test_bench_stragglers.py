"""The stragglers benchmark's judgement of an eviction: right or false, by the ranks it blames."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "bench_stragglers.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_stragglers", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_stragglers"] = module
    spec.loader.exec_module(module)
    return module


def _incident(evicted: list[str], ranks: list[int], rank: int | None = None) -> dict[str, Any]:
    return {"evicted": evicted, "rank": rank, "verdict": {"suspects": [{"node": evicted[0], "ranks": ranks}]}}


def test_an_eviction_is_judged_by_the_ranks_it_blames(bench: ModuleType) -> None:
    slowed = {3}
    assert bench._false_evictions([_incident(["node-4"], [3], rank=3)], slowed) == []  # rank 3 on a replacement
    assert bench._false_evictions([_incident(["node-0"], [0], rank=0)], slowed) == ["node-0"]


def test_an_eviction_that_blames_no_rank_is_judged_by_its_node(bench: ModuleType) -> None:
    """The pace's rounds may name a node alone: the slowed rank's node is right, another is false."""
    assert bench._false_evictions([_incident(["node-1"], [])], {3}) == []
    assert bench._false_evictions([_incident(["node-0"], [])], {3}) == ["node-0"]


def test_in_a_healthy_run_every_eviction_is_false(bench: ModuleType) -> None:
    assert bench._false_evictions([_incident(["node-1"], [])], set()) == ["node-1"]
    assert bench._false_evictions([_incident(["node-0"], [1], rank=1)], set()) == ["node-0"]
