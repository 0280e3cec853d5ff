"""The policy: a tiny causal transformer that reads bytes and answers in digits.

Shared by every role: the actor trains it, rollouts sample from it, the reference scores with its
initial weights (the same seed gives the same weights everywhere: no download, no SFT).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from task import ANSWER_BASE, ANSWER_CLASSES, DIGITS, PROMPT_LEN

VOCAB = 257  # bytes and the end-of-document token
MAX_LEN = PROMPT_LEN + DIGITS


class TinyPolicy(nn.Module):
    def __init__(self, dim: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(MAX_LEN, dim)
        block = nn.TransformerEncoderLayer(
            dim, heads, 4 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, ANSWER_CLASSES)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(idx.size(1), device=idx.device)
        x = self.blocks(x, mask=mask, is_causal=True)
        return self.head(self.ln(x))  # logits over the answer digits, at every position


def build_policy(seed: int) -> TinyPolicy:
    """The initial policy: the same weights for the same seed, in every role."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return TinyPolicy()


@torch.no_grad()
def generate(
    policy: TinyPolicy, prompts: torch.Tensor, group: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """`group` answers per prompt: (answer tokens [P*group, DIGITS], their log-probabilities)."""
    seq = prompts.repeat_interleave(group, dim=0)
    answers, logprobs = [], []
    for _ in range(DIGITS):
        logp = torch.log_softmax(policy(seq)[:, -1].float(), dim=-1)
        choice = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        answers.append(choice)
        logprobs.append(logp.gather(1, choice[:, None]).squeeze(1))
        seq = torch.cat([seq, (choice + ANSWER_BASE)[:, None]], dim=1)
    return torch.stack(answers, 1) + ANSWER_BASE, torch.stack(logprobs, 1)


def answer_logprobs(policy: nn.Module, prompts: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """Per-token log-probabilities [N, DIGITS] of `answers` (byte tokens) after `prompts` [N, PROMPT_LEN]."""
    seq = torch.cat([prompts, answers], dim=1)
    logits = policy(seq[:, :-1])[:, PROMPT_LEN - 1 :].float()
    return torch.log_softmax(logits, dim=-1).gather(2, (answers - ANSWER_BASE)[..., None]).squeeze(2)
