"""The straggler scores' peers' medians, taken without walking the group once per rank, are those of
the plain definition (the median over every other rank), value for value."""

from __future__ import annotations

from statistics import median

from hypothesis import given, settings
from hypothesis import strategies as st

from stalwart.controller.core.detectors.straggler_scores import RankScore, Sample, median_without, score_group

durations = st.sampled_from([0.0, 0.01, 0.1, 0.2, 0.25, 0.5]) | st.floats(0.0, 2.0, allow_nan=False)


@given(st.lists(durations, min_size=2, max_size=20), st.data())
def test_median_without_one_value_is_the_median_of_the_rest(values: list[float], data: st.DataObject) -> None:
    i = data.draw(st.integers(0, len(values) - 1))
    assert median_without(sorted(values), values[i]) == median(values[:i] + values[i + 1 :])


def _score_group_by_definition(history: dict[int, list[Sample]], recent: int, min_samples: int) -> dict[int, RankScore]:
    windows = {r: list(s[-recent:]) for r, s in history.items() if len(s) >= min_samples}
    totals = {r: median(s.total for s in w) for r, w in windows.items()}
    phases = {
        r: {k: median(s.own.get(k, 0.0) for s in w) for k in sorted({k for s in w for k in s.own})}
        for r, w in windows.items()
    }
    out: dict[int, RankScore] = {}
    for rank, own in totals.items():
        others = [r for r in totals if r != rank]
        if not others:
            continue
        peers = median(totals[r] for r in others)
        peer_phases = {k: median(phases[r].get(k, 0.0) for r in others) for k in phases[rank]}
        by_phase = {k: phases[rank][k] - peer_phases[k] for k in phases[rank]}
        earlier = history[rank][:-recent]
        before = median(s.total for s in earlier) if len(earlier) >= min_samples else own
        out[rank] = RankScore(
            rank=rank,
            relative=min(1.0, peers / own) if own > 0 else 1.0,
            individual=min(1.0, before / own) if own > 0 else 1.0,
            excess=own - peers,
            phase=max(by_phase, key=lambda k: by_phase[k]),
            own=own,
            peers=peers,
        )
    return out


own_work = st.fixed_dictionaries(
    {"data": durations, "optimizer": durations, "other": durations}
) | st.fixed_dictionaries({"step": durations})


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.integers(0, 40), st.lists(own_work, min_size=0, max_size=14), max_size=12))
def test_score_group_matches_its_definition(works: dict[int, list[dict[str, float]]]) -> None:
    history = {rank: [Sample(step, own) for step, own in enumerate(ws)] for rank, ws in works.items()}
    assert score_group(history, 8, min_samples=5) == _score_group_by_definition(history, 8, 5)


def test_a_whole_data_parallel_dimension_is_scored_in_one_pass() -> None:
    """8,000 ranks (1,000 nodes x 8, one data-parallel group) score; the old per-rank walk over the
    group took tens of seconds here."""
    history = {r: [Sample(s, {"step": 0.2 + (0.3 if r == 17 else 0.0)}) for s in range(8)] for r in range(8000)}
    scores = score_group(history, 8, min_samples=5)
    assert len(scores) == 8000
    assert scores[17].relative < 0.5 and scores[18].relative == 1.0
