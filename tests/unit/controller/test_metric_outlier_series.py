"""The metric-outlier detector's matrices, built from each node's digested samples with numpy, are the
ones its plain walk gave: every node's samples side by side by step (the newest MAX_SAMPLES steps
any node sampled; a node's earliest sample of each step), or by position when no sample has a step
(aligned on the newest, as the diagnosis' matrix aligns them)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from stalwart.controller.core.detectors.metric_outliers import PACE_METRICS, _pace_samples, _units
from stalwart.controller.core.metric_windows import MAX_SAMPLES, series_of


def reference(windows: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, list[float | None]]]:
    """The walk the digests replaced."""
    mine = {node: {v["step"]: v for v in reversed(w) if isinstance(v.get("step"), int)} for node, w in windows.items()}
    steps = sorted(set().union(*mine.values()))[-MAX_SAMPLES:]
    stepped = {node: [s.get(step, {}) for step in steps] for node, s in mine.items()} if steps else windows
    return {
        node: {k: v for k, v in series_of(w).items() if k in PACE_METRICS and any(x is not None for x in v)}
        for node, w in stepped.items()
    }


def same(a: list[float | None], b: list[float]) -> bool:
    """Equal as the diagnosis' matrix holds them: aligned on the newest value, NaN where none."""
    width = max(len(a), len(b))
    left = [math.nan] * (width - len(a)) + [math.nan if x is None else x for x in a]
    right = [math.nan] * (width - len(b)) + list(b)
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(left, right, strict=True))


value = st.one_of(st.none(), st.floats(0.01, 10.0), st.integers(1, 1000), st.just("n/a"))
sample = st.fixed_dictionaries(
    {"step": st.one_of(st.integers(0, 300), st.none()), "step_time_s": value, "tokens_per_second": value}
)


@given(st.dictionaries(st.sampled_from([f"node-{i}" for i in range(6)]), st.lists(sample, min_size=1, max_size=40)))
def test_the_digested_series_are_the_walks(windows: dict[str, list[dict[str, Any]]]) -> None:
    # (the stepless case: every sample of every node without a step)
    for given_windows in (windows, {n: [{**v, "step": None} for v in w] for n, w in windows.items()}):
        if not given_windows:
            continue
        want = reference(given_windows)
        units = _units({n: _pace_samples(w) for n, w in given_windows.items()})
        assert units.nodes == sorted(want)
        assert set(units.matrices) == {name for series in want.values() for name in series}
        for i, node in enumerate(units.nodes):
            for name, matrix in units.matrices.items():
                assert same(want[node].get(name, []), matrix[i].tolist()), (node, name)
