"""Users' data: Hugging Face files (parquet, jsonl, arrow) tokenized with `tokenizers`, and Megatron indexed
datasets, under the loader's guarantees: exact resume, exact data-parallel resize, corruption refused by
file name, and a shadow loader serving what the in-process loader computes."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from support.cli_invoke import Cli
from support.dataloader import SEQ_LEN, build_corpus, build_hf_corpus, build_megatron_corpus

from stalwart.dataloader import (
    DataConfig,
    DeterministicLoader,
    LoaderState,
    ShadowLoaderClient,
    ShadowLoaderSupervisor,
    ShardError,
    SourceSpec,
    TokenDataset,
    global_ids,
)

# One worker runs the whole module: it imports datasets, tokenizers and megatron-core once, not every
# worker that gets one of its tests.
pytestmark = pytest.mark.xdist_group("users-data-formats")


@pytest.fixture(scope="module", params=["hf", "megatron", "mixed"])
def config(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> DataConfig:
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "hf":
        return build_hf_corpus(root)
    if request.param == "megatron":
        return build_megatron_corpus(root)
    # a mixture across formats: prose from .stok, code from parquet/jsonl, numbers from Megatron
    stok, hf, mg = build_corpus(root / "stok"), build_hf_corpus(root / "hf"), build_megatron_corpus(root / "mg")
    return stok.model_copy(update={"sources": [stok.sources[0], hf.sources[1], mg.sources[2]]})


def run(config: DataConfig, start: dict | None, *, dp_size: int, micro: int, steps: int) -> tuple[list, list, dict]:
    """`dp_size` ranks in one process: (ids, token rows) in global order, and the state after."""
    loaders = [DeterministicLoader(config, dp_rank=r, dp_size=dp_size, micro_batch=micro) for r in range(dp_size)]
    if start is not None:
        for loader in loaders:
            loader.load_state_dict(start)
    ids: list[int] = []
    rows: list[list[int]] = []
    for _ in range(steps):
        for loader in loaders:
            batch = loader.next_batch()
            ids += batch.sample_ids.tolist()
            rows += batch.tokens.tolist()
    state = loaders[0].state_dict()
    for loader in loaders:
        loader.close()
    return ids, rows, state


def test_resume_from_saved_state_equals_an_uninterrupted_run(config: DataConfig) -> None:
    whole_ids, whole_rows, _ = run(config, None, dp_size=2, micro=4, steps=70)  # crosses the milestone at 400
    first_ids, first_rows, state = run(config, None, dp_size=2, micro=4, steps=30)
    rest_ids, rest_rows, _ = run(config, json.loads(json.dumps(state)), dp_size=2, micro=4, steps=40)
    assert first_ids + rest_ids == whole_ids == global_ids(config, 0, 560).tolist()
    assert first_rows + rest_rows == whole_rows
    assert all(len(r) == SEQ_LEN + 1 for r in whole_rows)


@pytest.mark.parametrize(("before", "after"), [((4, 4), (2, 8)), ((4, 2), (2, 2))])
def test_a_data_parallel_resize_continues_at_exactly_the_next_sample(
    config: DataConfig, before: tuple[int, int], after: tuple[int, int]
) -> None:
    first, _, state = run(config, None, dp_size=before[0], micro=before[1], steps=7)
    second, _, _ = run(
        config, LoaderState.model_validate(state).model_dump(), dp_size=after[0], micro=after[1], steps=5
    )
    total = 7 * before[0] * before[1] + 5 * after[0] * after[1]
    assert first + second == global_ids(config, 0, total).tolist()


def test_far_positions_wrap_epochs_in_constant_time(config: DataConfig) -> None:
    dataset = TokenDataset(config)
    try:
        near, far = dataset.fetch(np.arange(10**3, 10**3 + 8)), dataset.fetch(np.arange(10**7, 10**7 + 8))
        assert near[0].shape == far[0].shape == (8, SEQ_LEN + 1)
        assert dataset.fetch(np.arange(10**7, 10**7 + 8))[1].tolist() == far[1].tolist()
    finally:
        dataset.close()


def test_the_shadow_loader_serves_the_in_process_batches(config: DataConfig) -> None:
    sup = ShadowLoaderSupervisor(
        config, job=f"test-{uuid.uuid4().hex[:8]}", node="node-0", lanes=2, max_micro_batch=4, slots=4
    ).start()
    try:
        clients = [
            ShadowLoaderClient(
                sup.name, lane=r, dp_rank=r, dp_size=2, micro_batch=4, config=config, local_fallback=False
            )
            for r in range(2)
        ]
        local = [DeterministicLoader(config, dp_rank=r, dp_size=2, micro_batch=4) for r in range(2)]
        for _ in range(30):
            for c, ref in zip(clients, local, strict=True):
                got, want = c.next_batch(), ref.next_batch()
                assert got.served_by == "shadow"
                assert got.sample_ids.tolist() == want.sample_ids.tolist()
                assert got.tokens.tolist() == want.tokens.tolist()
        for c in clients:
            c.close()
        for loader in local:
            loader.close()
    finally:
        sup.close()


# ------------------------------------------------------------------------------------------ corruption
def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_a_parquet_file_is_refused_by_name(tmp_path: Path) -> None:
    config = build_hf_corpus(tmp_path)
    TokenDataset(config).close()  # builds the index
    parquet = tmp_path / "prose.parquet"
    flip(parquet, parquet.stat().st_size // 2)
    with pytest.raises(ShardError, match=r"prose\.parquet: corrupted or changed since its index was built"):
        TokenDataset(config)


def test_a_flipped_byte_in_the_tokenized_index_is_refused_when_read(tmp_path: Path) -> None:
    config = build_hf_corpus(tmp_path, schedule=False)
    TokenDataset(config).close()
    (shard,) = (tmp_path / ".stalwart-index").glob("code-*/shard-00000.stok")
    flip(shard, 64 + 10)  # a token in block 0
    dataset = TokenDataset(config)
    try:
        with pytest.raises(ShardError, match=r"shard-00000\.stok: corrupted tokens in block 0"):
            dataset.fetch(np.arange(0, 2000))
    finally:
        dataset.close()


def test_a_flipped_byte_in_a_megatron_dataset_is_refused_by_name(tmp_path: Path) -> None:
    config = build_megatron_corpus(tmp_path, schedule=False)
    TokenDataset(config).close()  # takes the checksums once (the sidecar)
    assert (tmp_path / "numbers.bin.stwsum.json").is_file()
    flip(tmp_path / "numbers.bin", 100)
    dataset = TokenDataset(config)
    try:
        with pytest.raises(ShardError, match=r"numbers\.bin: corrupted data in block 0"):
            dataset.fetch(np.arange(0, 2000))
    finally:
        dataset.close()
    flip(tmp_path / "numbers.bin", 100)  # repaired
    flip(tmp_path / "code.idx", 40)
    with pytest.raises(ShardError, match=r"code\.idx: corrupted or changed"):
        TokenDataset(config)


# ------------------------------------------------------------------------------------------ config
def test_the_format_defaults_to_stok_and_bad_fields_are_named() -> None:
    assert SourceSpec(name="a", shards=["x.stok"]).format == "stok"
    with pytest.raises(ValidationError, match="tokenizer is required for format 'hf'"):
        SourceSpec(name="a", shards=["x.parquet"], format="hf")
    with pytest.raises(ValidationError, match="must end in one of"):
        SourceSpec(name="a", shards=["x.csv"], format="hf", tokenizer="t.json")
    with pytest.raises(ValidationError, match="must name .bin files"):
        SourceSpec(name="a", shards=["x.idx"], format="megatron")
    with pytest.raises(ValidationError, match="tokenizer only applies to format 'hf'"):
        SourceSpec(name="a", shards=["x.stok"], tokenizer="t.json")
    with pytest.raises(ValidationError, match="format"):
        SourceSpec.model_validate({"name": "a", "shards": ["x"], "format": "csv"})


def test_reading_stok_imports_neither_datasets_nor_tokenizers(tmp_path: Path) -> None:
    config = build_corpus(tmp_path)
    code = (
        "import sys; from stalwart.dataloader import DataConfig, DeterministicLoader\n"
        f"c = DataConfig.loads({config.dumps()!r})\n"
        "DeterministicLoader(c, dp_rank=0, dp_size=1, micro_batch=2).next_batch()\n"
        "print(sorted(m for m in ('datasets', 'tokenizers', 'megatron') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_stalwart_data_index_builds_refuses_a_changed_file_and_rebuilds(tmp_path: Path, cli: Cli) -> None:
    import datasets

    config = build_hf_corpus(tmp_path / "hf", schedule=False)
    mg = build_megatron_corpus(tmp_path / "mg", schedule=False)
    config = DataConfig(sources=[config.sources[0], mg.sources[1]], seq_len=SEQ_LEN)
    config_file = tmp_path / "data.json"
    config_file.write_text(config.dumps())
    first = cli("data", "index", str(config_file))
    assert first.returncode == 0, first.stderr
    assert "prose: hf, 172 samples per epoch" in first.stdout and "code: megatron" in first.stdout
    assert (tmp_path / "mg" / "code.bin.stwsum.json").is_file()
    parquet = tmp_path / "hf" / "prose.parquet"
    datasets.Dataset.from_parquet(str(parquet)).select(range(10)).to_parquet(str(parquet))  # the data changed
    refused = cli("data", "index", str(config_file))
    assert refused.returncode == 1 and "prose.parquet: corrupted or changed" in refused.stderr
    again = cli("data", "index", "--rebuild", str(config_file))
    assert again.returncode == 0, again.stderr
    assert "prose: hf, 172 samples per epoch" not in again.stdout
    parquet.write_bytes(b"not parquet")
    broken = cli("data", "index", "--rebuild", str(config_file))
    assert broken.returncode == 1 and "prose.parquet: source 'prose' cannot be read as parquet" in broken.stderr
