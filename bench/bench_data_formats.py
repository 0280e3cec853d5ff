"""Time to the first batch when resuming at global position 10^7 against 10^3, for each data format.

    .venv/bin/python bench/bench_data_formats.py          # about a minute on 2 shared cores

Formats: stok (the project's shards), hf parquet, hf jsonl, megatron (.bin/.idx written here in the format
megatron-core's builder writes). The dataset is generated on the fly (a few thousand documents); position
10^7 lies in a later epoch of each source, as the global order defines it (every source wraps into its
next epoch independently), so it exists without 10^7 samples on disk. The one-time index (tokenization,
checksum sidecar) is built before timing. Each timing is a fresh in-process loader: open the sources (for
hf: hash the data files against the index), load a state at the position, fetch the first batch; the median
of the repeats. O(1) resume means a ratio near 1. Writes bench/results/data-formats.md.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import random
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from stalwart.dataloader import ByteTokenizer, DataConfig, DeterministicLoader, SourceSpec, write_shard
from stalwart.dataloader.state import state_at

SEQ_LEN, MICRO, REPEATS, DOCS = 64, 8, 7, 4000
RESULTS = Path(__file__).parent / "results" / "data-formats.md"


def documents() -> list[str]:
    rng = random.Random(7)
    words = ["data", "loader", "exact", "resume", "token", "shard", "epoch", "rank", "batch", "stalwart"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(20, 120))) for _ in range(DOCS)]


def byte_tokens(docs: list[str]) -> np.ndarray:
    tok = ByteTokenizer()
    return np.concatenate([np.append(tok.encode(d), tok.eos_id) for d in docs]).astype(np.uint16)


def write_megatron(prefix: Path, docs: list[str]) -> Path:
    tok = ByteTokenizer()
    seqs = [np.append(tok.encode(d), tok.eos_id).astype(np.uint16) for d in docs]
    prefix.with_suffix(".bin").write_bytes(b"".join(s.tobytes() for s in seqs))
    sizes = np.array([len(s) for s in seqs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)[:-1]]) * 2
    with open(prefix.with_suffix(".idx"), "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(seqs), len(seqs) + 1))
        f.write(
            sizes.tobytes() + pointers.astype(np.int64).tobytes() + np.arange(len(seqs) + 1, dtype=np.int64).tobytes()
        )
    return prefix.with_suffix(".bin")


def configs(root: Path) -> dict[str, DataConfig]:
    import datasets
    from tokenizers import Tokenizer, models, pre_tokenizers

    datasets.disable_progress_bars()
    docs = documents()
    write_shard(root / "data.stok", byte_tokens(docs), vocab_size=257, eos_id=256, doc_count=len(docs))
    ds = datasets.Dataset.from_dict({"text": docs})
    ds.to_parquet(str(root / "data.parquet"))
    ds.to_json(str(root / "data.jsonl"), lines=True)
    tok = Tokenizer(
        models.WordLevel(
            {w: i for i, w in enumerate(["<unk>", "<eos>", *sorted(set(" ".join(docs).split()))])}, unk_token="<unk>"
        )
    )
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(root / "tokenizer.json"))
    hf = {"format": "hf", "tokenizer": str(root / "tokenizer.json"), "eos_token": "<eos>"}
    specs = {
        "stok": SourceSpec(name="d", shards=[str(root / "data.stok")]),
        "hf parquet": SourceSpec(name="d", shards=[str(root / "data.parquet")], **hf),  # type: ignore[arg-type]
        "hf jsonl": SourceSpec(name="d", shards=[str(root / "data.jsonl")], **hf),  # type: ignore[arg-type]
        "megatron": SourceSpec(name="d", shards=[str(write_megatron(root / "data", docs))], format="megatron"),
    }
    return {k: DataConfig(sources=[s], seq_len=SEQ_LEN, seed=3) for k, s in specs.items()}


def first_batch_seconds(config: DataConfig, position: int) -> float:
    t0 = time.perf_counter()
    loader = DeterministicLoader(config, dp_rank=0, dp_size=1, micro_batch=MICRO)
    loader.load_state_dict(state_at(loader.dataset, position))
    loader.next_batch()
    elapsed = time.perf_counter() - t0
    loader.close()
    return elapsed


def main() -> int:
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in configs(Path(tmp)).items():
            DeterministicLoader(config, dp_rank=0, dp_size=1, micro_batch=MICRO).close()  # the one-time index
            samples = (
                DeterministicLoader(config, dp_rank=0, dp_size=1, micro_batch=MICRO).dataset.sources[0].num_samples
            )
            near = statistics.median(first_batch_seconds(config, 10**3) for _ in range(REPEATS))
            far = statistics.median(first_batch_seconds(config, 10**7) for _ in range(REPEATS))
            rows.append((name, samples, near, far))
            print(
                f"{name:11s} {samples:6d} samples/epoch  10^3: {near * 1e3:7.2f} ms  "
                f"10^7: {far * 1e3:7.2f} ms  ratio {far / near:.2f}"
            )
    load_after = os.getloadavg()
    lines = [
        "# Data formats: time to the first batch when resuming at 10^7 against 10^3",
        "",
        f"Run {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC: `.venv/bin/python bench/bench_data_formats.py`",
        f"on {platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after (the machine is shared).",
        "",
        f"Configuration: one source of {DOCS} generated documents per format, seq_len {SEQ_LEN}, micro batch {MICRO}, "
        f"one rank; median of {REPEATS} fresh loaders (open, load state, first batch); the one-time index is built "
        "before timing. Position 10^7 lies in a later epoch (each source wraps into its next epoch in the "
        "global order).",
        "",
        "| format | samples per epoch | first batch at 10^3 | first batch at 10^7 | ratio |",
        "|---|---|---|---|---|",
        *[f"| {n} | {s} | {a * 1e3:.2f} ms | {b * 1e3:.2f} ms | {b / a:.2f} |" for n, s, a, b in rows],
        "",
    ]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("\n".join(lines))
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
