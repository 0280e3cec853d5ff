"""The task: reverse four digits. A prompt reads `rev 4821:`; the right answer is `1284`.

The reward is the fraction of the answer's four digits that are right, position by position, so an
untrained policy scores about 0.1 (one digit in ten) and a perfect one scores 1.0. The prompts are a
token shard, one prompt per sample, read through the deterministic data loader (stalwart.dataloader).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np

from stalwart.dataloader import ByteTokenizer, DataConfig, SourceSpec, write_shard

DIGITS = 4
PROMPT_LEN = len("rev 0000:")  # bytes
SEQ_LEN = PROMPT_LEN + 1  # one sample = a prompt and its end-of-document token
ANSWER_BASE = ord("0")  # the policy answers in digits: class k is the byte of digit k
ANSWER_CLASSES = 10
TOKENIZER = ByteTokenizer()


def prompt_text(digits: str) -> str:
    return f"rev {digits}:"


def write_prompts(path: Path, count: int, seed: int) -> Path:
    """A shard of `count` random prompts, the same for the same seed. Every rank may call it (ranks on
    other machines need their own copy): each writes under its own name and renames, so a reader never
    sees half a shard and two writers never mix."""
    if path.exists():
        return path
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        digits = "".join(rng.choice("0123456789") for _ in range(DIGITS))
        rows.append(np.append(TOKENIZER.encode(prompt_text(digits)), TOKENIZER.eos_id))
    # One more end-of-document token: the loader's last window needs seq_len + 1 tokens.
    tokens = np.concatenate([*rows, [TOKENIZER.eos_id]]).astype(np.uint16)
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = path.with_name(f"{path.name}.{os.getpid()}")
    write_shard(mine, tokens, vocab_size=TOKENIZER.vocab_size, eos_id=TOKENIZER.eos_id, doc_count=count)
    os.replace(mine, path)
    return path


def data_config(path: Path, seed: int) -> DataConfig:
    return DataConfig(sources=[SourceSpec(name="prompts", shards=[str(path)])], seq_len=SEQ_LEN, seed=seed)


def expected_answer(prompt_tokens: list[int]) -> str:
    text = TOKENIZER.decode(prompt_tokens[:PROMPT_LEN])
    if not (text.startswith("rev ") and text.endswith(":") and text[4:-1].isdigit()):
        raise ValueError(f"not a prompt of this task: {text!r}")
    return text[4:-1][::-1]


def reward(prompt_tokens: list[int], answer_tokens: list[int]) -> float:
    """The rule: the fraction of positions where the answer holds the prompt's digits reversed."""
    expected = expected_answer(prompt_tokens)
    answer = TOKENIZER.decode(answer_tokens)
    return sum(a == b for a, b in zip(answer, expected, strict=False)) / len(expected)
