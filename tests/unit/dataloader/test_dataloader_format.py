"""Token shards: the builder, the file format, and bad data reported with the file and the problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.dataloader import CORPUS, build_corpus
from support.paths import REPO

from stalwart.dataloader import (
    ByteTokenizer,
    DataConfig,
    DataError,
    DeterministicLoader,
    ShardError,
    SourceSpec,
    TokenDataset,
    build_shards,
    verify_shards,
    write_shard,
)
from stalwart.dataloader.shard_format import HEADER_SIZE, read_header
from stalwart.dataloader.token_shard import TokenShard


def one_source_config(shards: list[Path], seq_len: int = 32) -> DataConfig:
    return DataConfig(sources=[SourceSpec(name="only", shards=[str(p) for p in shards])], seq_len=seq_len)


def test_builder_keeps_every_document_and_ends_each_with_eos(tmp_path: Path) -> None:
    paths = build_shards([CORPUS / "code.txt"], tmp_path, shard_tokens=1000, doc_per="line")
    assert len(paths) > 3
    tok = ByteTokenizer()
    stream = np.concatenate([TokenShard(p).read(0, read_header(p).token_count) for p in paths])
    docs = [d for d in np.split(stream, np.nonzero(stream == tok.eos_id)[0] + 1) if d.size]
    lines = [line for line in (CORPUS / "code.txt").read_text().splitlines() if line.strip()]
    assert [tok.decode(d) for d in docs] == lines
    assert all(d[-1] == tok.eos_id for d in docs)
    assert sum(read_header(p).doc_count for p in paths) == len(lines)


def test_builder_refuses_to_mix_with_old_shards_and_non_utf8_input(tmp_path: Path) -> None:
    build_shards([CORPUS / "code.txt"], tmp_path / "out")
    with pytest.raises(DataError, match="already holds"):
        build_shards([CORPUS / "code.txt"], tmp_path / "out")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9\n")
    with pytest.raises(DataError, match=r"latin1\.txt: not UTF-8"):
        build_shards([bad], tmp_path / "out2")


def test_build_and_verify_entry_points_run_without_torch(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "stalwart.dataloader.build",
            str(tmp_path),
            str(CORPUS / "numbers.txt"),
            "--shard-tokens",
            "4000",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    shards = out.stdout.split()
    assert len(shards) == 3 and all(Path(s).exists() for s in shards)
    ok = subprocess.run([sys.executable, "-m", "stalwart.dataloader.verify", *shards], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.count("ok ") == 3
    # The builder and the loader process must not pay for importing torch.
    code = "import sys, stalwart.dataloader.build, stalwart.dataloader.shadow_process; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_windows_are_packed_token_ranges_of_the_stream(tmp_path: Path) -> None:
    tokens = np.arange(1000, dtype=np.int64) % 257
    write_shard(tmp_path / "a.stok", tokens, vocab_size=257, eos_id=256)
    config = one_source_config([tmp_path / "a.stok"], seq_len=10)
    ds = TokenDataset(config)
    assert ds.sources[0].num_samples == 99  # (1000 - 1) // 10 windows of 11 tokens
    out, ids = ds.fetch(np.arange(99))
    for row, sample_id in zip(out, ids.tolist(), strict=True):
        i = sample_id & ((1 << 40) - 1)
        assert row.tolist() == tokens[i * 10 : i * 10 + 11].tolist()
    assert sorted(i & ((1 << 40) - 1) for i in ids.tolist()) == list(range(99))
    ds.close()


# ------------------------------------------------------------------------------------ bad data
@pytest.fixture
def shard(tmp_path: Path) -> Path:
    """One shard of 20 blocks of 64 tokens."""
    rng = np.random.default_rng(0)
    path = tmp_path / "data-00000.stok"
    write_shard(path, rng.integers(0, 257, 1280), vocab_size=257, eos_id=256, block_tokens=64)
    return path


def test_a_truncated_shard_is_reported_with_its_name_at_open(shard: Path) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    with pytest.raises(ShardError, match=rf"{shard}: truncated: the header promises 1280 tokens"):
        TokenDataset(one_source_config([shard]))
    shard.write_bytes(data[:40])
    with pytest.raises(ShardError, match=rf"{shard}: truncated: 40 bytes"):
        DeterministicLoader(one_source_config([shard]), dp_rank=0, dp_size=1, micro_batch=4)


def test_a_corrupted_token_is_reported_with_its_name_and_block_on_first_read(shard: Path) -> None:
    raw = bytearray(shard.read_bytes())
    raw[HEADER_SIZE + 2 * 64 * 7 + 10] ^= 0x01  # one bit in block 7
    shard.write_bytes(bytes(raw))
    loader = DeterministicLoader(one_source_config([shard], seq_len=16), dp_rank=0, dp_size=1, micro_batch=4)
    with pytest.raises(ShardError, match=rf"{shard}: corrupted tokens in block 7 \(tokens 448\.\.511\)"):
        for _ in range(100):  # bounded: an epoch is 79 samples, 20 batches
            loader.next_batch()
    with pytest.raises(ShardError, match="block 7"):
        verify_shards([shard])


@pytest.mark.parametrize(
    ("offset", "problem"),
    [(0, "not a Stalwart token shard"), (20, "header checksum mismatch"), (-3, "block checksum table is corrupted")],
)
def test_damaged_header_or_checksum_table_is_reported(shard: Path, offset: int, problem: str) -> None:
    raw = bytearray(shard.read_bytes())
    raw[offset] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match=rf"{shard}: {problem}"):
        TokenDataset(one_source_config([shard]))


def test_trailing_garbage_missing_files_and_empty_globs_are_errors(shard: Path, tmp_path: Path) -> None:
    with open(shard, "ab") as f:
        f.write(b"junk")
    with pytest.raises(ShardError, match=rf"{shard}: 4 unexpected trailing bytes"):
        TokenDataset(one_source_config([shard]))
    with pytest.raises(ShardError, match="nope.stok: no such shard file"):
        TokenDataset(one_source_config([tmp_path / "nope.stok"]))
    with pytest.raises(DataError, match=r"source 'only': shard pattern .* matches no file"):
        TokenDataset(one_source_config([tmp_path / "missing" / "*.stok"]))


def test_a_source_too_short_for_one_sequence_is_an_error(tmp_path: Path) -> None:
    write_shard(tmp_path / "tiny.stok", np.arange(10), vocab_size=257)
    with pytest.raises(DataError, match="source 'only' has weight .* but no samples"):
        TokenDataset(one_source_config([tmp_path / "tiny.stok"], seq_len=32))


def test_the_fixture_corpus_verifies(tmp_path: Path) -> None:
    config = build_corpus(tmp_path)
    headers = verify_shards([p for s in config.sources for p in s.resolve()])
    assert sum(h.token_count for h in headers) > 30_000


def test_the_fixture_corpus_builds_into_several_shards_per_source(data_config: DataConfig) -> None:
    for spec in data_config.sources:
        assert len(spec.resolve()) >= 2, spec
