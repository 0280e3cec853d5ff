"""The global order: a pure function of (seed, mixture, position) with random access, exact mixing,
epochs that see each sample once, data-parallel slices of one global order, and a tiny state."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support.dataloader import SOURCES, SWITCH_AT, build_corpus

from stalwart.dataloader import (
    DataConfig,
    DataError,
    DeterministicLoader,
    LoaderState,
    Milestone,
    StateMismatch,
    TokenDataset,
    decode_sample_id,
    global_ids,
    linear_ramp,
)
from stalwart.dataloader.feistel import permute
from stalwart.dataloader.interleave import Interleave
from stalwart.dataloader.sample_id import encode_one


@pytest.fixture(scope="module")
def dataset(data_config: DataConfig) -> TokenDataset:
    return TokenDataset(data_config)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 100, 1000, 4097])
def test_the_permutation_is_a_bijection_and_depends_on_the_key(n: int) -> None:
    a = permute(np.arange(n), np.full(n, n), np.full(n, 1))
    b = permute(np.arange(n), np.full(n, n), np.full(n, 2))
    assert sorted(a.tolist()) == list(range(n))
    assert sorted(b.tolist()) == list(range(n))
    if n >= 7:
        assert a.tolist() != b.tolist()


def test_the_interleave_is_exact_and_never_far_from_the_weights() -> None:
    weights = [5, 0, 3, 1, 7]
    il = Interleave(weights, seed=3)
    n = 5000
    source, index = il.locate(np.arange(n))
    assert 1 not in set(source.tolist())  # weight 0: never chosen
    for s in range(len(weights)):
        mine = index[source == s]
        assert mine.tolist() == list(range(mine.size))  # each source's positions are numbered 0, 1, 2...
    for prefix in (1, 17, 250, 4999, 5000):
        counts = il.counts(prefix)
        assert counts == np.bincount(source[:prefix], minlength=len(weights)).tolist()
        for s, w in enumerate(weights):
            assert abs(counts[s] - prefix * w / sum(weights)) <= 3  # within a sample per tree level
    assert Interleave(weights, seed=4).locate(np.arange(50))[0].tolist() != source[:50].tolist()


def test_random_access_equals_replay_across_epochs_and_the_milestone(dataset: TokenDataset) -> None:
    """Replay position by position with running counters; the closed form must agree everywhere."""
    order = dataset.order
    n = 3000  # well past the milestone at 400 and through several epochs of every source
    refs = order.locate(np.arange(n))
    served: Counter[int] = Counter()
    seen: dict[tuple[int, int], list[int]] = {}
    for p in range(n):
        one = order.locate([p])  # each position alone: no shared work with its neighbours
        s = int(one.source[0])
        size = int(order.sizes[s])
        assert int(one.epoch[0]) == served[s] // size
        closed_form = (int(refs.source[p]), int(refs.epoch[p]), int(refs.index[p]))
        assert closed_form == (s, int(one.epoch[0]), int(one.index[0]))
        seen.setdefault((s, int(one.epoch[0])), []).append(int(one.index[0]))
        served[s] += 1
    for (s, epoch), indices in seen.items():
        assert len(set(indices)) == len(indices), "a sample repeated within an epoch"
        if (served[s] - 1) // int(order.sizes[s]) > epoch:  # a completed epoch holds every sample once
            assert sorted(indices) == list(range(int(order.sizes[s])))
    assert all(
        order.served_before(p).tolist() == [sum(1 for q in range(p) if refs.source[q] == s) for s in range(3)]
        for p in (0, 399, 400, 401, 2999)
    )


def test_the_milestone_changes_the_mixture_at_exactly_its_sample(dataset: TokenDataset) -> None:
    source = dataset.order.locate(np.arange(2 * SWITCH_AT)).source
    before = np.bincount(source[:SWITCH_AT], minlength=3) / SWITCH_AT
    after = np.bincount(source[SWITCH_AT:], minlength=3) / SWITCH_AT
    assert np.allclose(before, [0.5, 0.3, 0.2], atol=0.01)
    assert np.allclose(after, [0.2, 0.3, 0.5], atol=0.01)
    assert dataset.order.weights_at(SWITCH_AT - 1) != dataset.order.weights_at(SWITCH_AT)


def test_a_linear_ramp_is_a_staircase_of_milestones(tmp_path: Path) -> None:
    ramp = linear_ramp({"prose": 1.0}, {"numbers": 1.0}, 0, 1000, pieces=4)
    assert [m.at_sample for m in ramp] == [0, 250, 500, 750, 1000]
    assert ramp[2].weights == {"numbers": 0.5, "prose": 0.5}
    config = build_corpus(tmp_path, schedule=False).model_copy(update={"weights": {}, "schedule": ramp})
    source = TokenDataset(config).order.locate(np.arange(1200)).source
    assert set(source[:250].tolist()) == {0} and set(source[1000:].tolist()) == {2}
    assert Milestone.at_step(10, 64, {"prose": 1}).at_sample == 640


def test_sample_ids_are_stable_and_decode(dataset: TokenDataset, data_config: DataConfig) -> None:
    ids = dataset.order.sample_ids(np.arange(1000))
    assert ids.tolist() == global_ids(data_config, 0, 1000).tolist()  # another opening, the same ids
    assert len(set(ids[:100].tolist())) == 100
    ref = decode_sample_id(int(ids[7]))
    assert encode_one(ref.source, ref.epoch, ref.index) == int(ids[7]) and ref.source < len(SOURCES)
    other_seed = data_config.model_copy(update={"seed": data_config.seed + 1})
    assert global_ids(other_seed, 0, 100).tolist() != ids[:100].tolist()


def test_far_positions_are_random_access_and_epoch_overflow_is_an_error(dataset: TokenDataset) -> None:
    for position in (10**7, 10**7 + 12345):
        assert (
            dataset.order.sample_ids([position]).tolist()
            == dataset.order.sample_ids(np.arange(position - 3, position + 4))[3:4].tolist()
        )
    with pytest.raises(DataError, match="more than 65536 epochs"):
        dataset.order.locate([10**11])


# --------------------------------------------------------------------------- data parallelism
def run(
    config: DataConfig,
    start: LoaderState | None,
    *,
    dp_size: int,
    micro: int,
    steps: int,
) -> tuple[list[int], dict]:
    """Simulate `dp_size` ranks in one process (the API is rank-explicit); returns global ids in order."""
    loaders = [DeterministicLoader(config, dp_rank=r, dp_size=dp_size, micro_batch=micro) for r in range(dp_size)]
    if start is not None:
        for loader in loaders:
            loader.load_state_dict(start)
    ids: list[int] = []
    for _ in range(steps):
        for loader in loaders:
            ids += loader.next_batch().sample_ids.tolist()
    states = {loader.dp_rank: loader.state_dict() for loader in loaders}
    assert len({str(s) for s in states.values()}) == 1, "every rank holds the same global state"
    return ids, states[0]


def test_ranks_take_contiguous_slices_of_one_global_order(data_config: DataConfig) -> None:
    ids, state = run(data_config, None, dp_size=4, micro=4, steps=10)
    assert ids == global_ids(data_config, 0, 160).tolist()
    assert state["position"] == 160


@pytest.mark.parametrize(("before", "after"), [((4, 4), (2, 8)), ((2, 8), (4, 4)), ((2, 4), (4, 4)), ((4, 2), (1, 3))])
def test_resuming_with_another_dp_size_continues_at_the_next_global_sample(
    data_config: DataConfig,
    before: tuple[int, int],
    after: tuple[int, int],
) -> None:
    first, state = run(data_config, None, dp_size=before[0], micro=before[1], steps=7)
    second, _ = run(data_config, LoaderState.model_validate(state), dp_size=after[0], micro=after[1], steps=5)
    total = 7 * before[0] * before[1] + 5 * after[0] * after[1]
    assert first + second == global_ids(data_config, 0, total).tolist()


# ------------------------------------------------------------------------------------------ state
def test_state_is_a_few_counters_and_the_delta_keeps_it_current(data_config: DataConfig) -> None:
    loader = DeterministicLoader(data_config, dp_rank=0, dp_size=2, micro_batch=4)
    base = LoaderState.model_validate(loader.state_dict())
    for _ in range(120):  # crosses the milestone at sample 400
        loader.next_batch()
        delta = loader.state_delta()
        assert len(str(delta)) < 80
        base = base.apply(delta)
    assert base.model_dump() == loader.state_dict()
    assert set(base.model_dump()) == {"version", "seed", "position", "fingerprint"}
    fresh = DeterministicLoader(data_config, dp_rank=1, dp_size=2, micro_batch=4)
    fresh.load_state_dict(base)
    assert fresh.next_batch().sample_ids.tolist() == global_ids(data_config, 964, 4).tolist()


def test_a_state_from_other_data_seed_or_mixture_history_is_refused(
    data_config: DataConfig,
    tmp_path: Path,
) -> None:
    loader = DeterministicLoader(data_config, dp_rank=0, dp_size=1, micro_batch=8)
    for _ in range(60):
        loader.next_batch()
    state = loader.state_dict()  # at sample 480: past the milestone at 400

    def load_into(config: DataConfig) -> None:
        DeterministicLoader(config, dp_rank=0, dp_size=1, micro_batch=8).load_state_dict(state)

    with pytest.raises(StateMismatch, match="seed"):
        load_into(data_config.model_copy(update={"seed": 99}))
    changed_past = data_config.model_copy(update={"schedule": [Milestone(at_sample=300, weights={"code": 1.0})]})
    with pytest.raises(StateMismatch, match="add a schedule milestone at or after sample 480"):
        load_into(changed_past)
    moved = [
        spec.model_copy(update={"shards": [str(tmp_path / "moved" / spec.name / "*.stok")]})
        for spec in data_config.sources
    ]
    for spec in data_config.sources:
        (tmp_path / "moved" / spec.name).mkdir(parents=True)
        for path in spec.resolve():
            shutil.copy(path, tmp_path / "moved" / spec.name / path.name)
    load_into(data_config.model_copy(update={"sources": moved}))  # the same shards elsewhere: accepted
    with pytest.raises(StateMismatch, match="other data"):
        load_into(build_corpus(tmp_path / "rebuilt", block_tokens=512))  # same text, other shard files
    shorter = data_config.model_copy(update={"seq_len": 16})
    with pytest.raises(StateMismatch, match="other data"):
        load_into(shorter)
    with pytest.raises(StateMismatch, match="not a loader state"):
        load_into_raw = DeterministicLoader(data_config, dp_rank=0, dp_size=1, micro_batch=8)
        load_into_raw.load_state_dict({"position": 3})
    # A future milestone may be added at any time: the consumed history is unchanged.
    extended = data_config.model_copy(
        update={"schedule": [*data_config.schedule, Milestone(at_sample=10_000, weights={"code": 1.0})]}
    )
    load_into(extended)
