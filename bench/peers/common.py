"""What every system in the peers benchmark trains: the pretraining example's model and step, a
deterministic data stream and the audit files the harness reads. Pure torch, no Stalwart import:
it runs in the peers' own virtual environment as well as in Stalwart's.

Data: sample `i` is 65 tokens drawn from a generator seeded with `i`, and step `s` of a world of
`W` ranks trains the samples `(s-1)*W*B + r*B ... + B-1` on rank `r`: a resumed run that restarts
at the right step sees exactly a clean run's samples, whatever the system, so the audit compares
like with like.

Audit files, in the folder the harness passes (`--out`): `rank-R.jsonl`, one line per completed
step `{"step", "pid", "t", "ids"}` (`t` the wall-clock time the step completed), `ckpt-R.jsonl`, one
line per checkpoint `{"step", "blocked"}` (seconds the training loop waited for it), and
`pid-R-<pid>` files the harness reads to find whom to kill.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import IO

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, BATCH = 257, 64, 8
# torch's own hang detection is the collective timeout (30 min by default for gloo): each peer sets it
# low, as a user who wants a hang noticed quickly would, so a SIGSTOPped rank fails its partners' next
# collective after this many seconds.
COLLECTIVE_TIMEOUT = 10.0


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """examples/pretrain_tiny.py's model, unchanged."""

    def __init__(self, vocab: int = VOCAB, dim: int = 64, layers: int = 2, heads: int = 4, seq: int = SEQ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def sample_ids(step: int, rank: int, world: int, batch: int = BATCH) -> list[int]:
    first = (step - 1) * world * batch + rank * batch
    return list(range(first, first + batch))


def batch_for(ids: list[int], seq: int = SEQ) -> torch.Tensor:
    rows = []
    for i in ids:
        g = torch.Generator().manual_seed(i)
        rows.append(torch.randint(0, VOCAB, (seq + 1,), generator=g))
    return torch.stack(rows)


def loss_of(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="the audit folder")
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=int, default=10, help="checkpoint every N steps")
    parser.add_argument("--step-delay", type=float, default=0.05, help="as the example's job runs it")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=COLLECTIVE_TIMEOUT,
        help="seconds a collective waits for a silent peer before it fails (how torch notices a hang)",
    )
    return parser.parse_args()


class Audit:
    """The per-rank audit files; every line flushed, so a killed process leaves what it finished."""

    def __init__(self, out: Path, rank: int) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"pid-{rank}-{os.getpid()}").write_text(str(time.time()))
        self._steps: IO[str] = open(out / f"rank-{rank}.jsonl", "a", encoding="utf-8")
        self._ckpts: IO[str] = open(out / f"ckpt-{rank}.jsonl", "a", encoding="utf-8")

    def step(self, step: int, ids: list[int]) -> None:
        line = {"step": step, "pid": os.getpid(), "t": time.time(), "ids": ids}
        self._steps.write(json.dumps(line) + "\n")
        self._steps.flush()

    def checkpoint(self, step: int, blocked: float) -> None:
        self._ckpts.write(json.dumps({"step": step, "blocked": blocked}) + "\n")
        self._ckpts.flush()

    def close(self) -> None:
        self._steps.close()
        self._ckpts.close()
