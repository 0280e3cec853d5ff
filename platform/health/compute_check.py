"""A deterministic compute check: one training step of a fixed-weight model on a fixed input.

Every rank computes the same thing, so every rank's result must be bitwise identical (on the same
hardware and software); a rank that differs has a GPU that computes wrong without saying so (silent
data corruption). The weights and input are closed-form functions of their index, not random, so
no RNG state or library version can change them.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Mapping

import torch

CORRUPT_ENV = "STALWART_FAULT_CORRUPT_COMPUTE"  # fault injection: "1" flips a bit in this rank's result

IN, HIDDEN, OUT, BATCH = 64, 128, 32, 16
LR = 0.1


def _fixed(shape: tuple[int, ...], phase: float, device: torch.device) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    idx = torch.arange(n, dtype=torch.float64)
    return (torch.sin(idx * 0.37 + phase) * 0.1).to(torch.float32).reshape(shape).to(device)


def reference_model(device: torch.device) -> torch.nn.Sequential:
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, OUT))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(_fixed(tuple(p.shape), float(i), torch.device("cpu")))
    return model.to(device)


def compute_step(device: torch.device, corrupt: bool = False) -> torch.Tensor:
    """Forward, backward and one SGD step; the output and the updated weights, flattened."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = reference_model(device)
    x = _fixed((BATCH, IN), 10.0, device)
    target = _fixed((BATCH, OUT), 20.0, device)
    out = model(x)
    loss = torch.nn.functional.mse_loss(out, target)
    loss.backward()
    with torch.no_grad():
        # Plain SGD by hand (what torch.optim.SGD does without momentum): torch.optim's first step
        # imports torch._dynamo, 4 CPU-seconds of a cold check rank's 9.
        for p in model.parameters():
            assert p.grad is not None
            p.add_(p.grad, alpha=-LR)
        result = torch.cat([out.detach().flatten(), *(p.detach().flatten() for p in model.parameters())])
    if corrupt:
        bits = result.view(torch.int32)
        bits[0] ^= 1  # one flipped low bit: as silent as real corruption gets
    return result


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def compute_digest(device: torch.device, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return digest(compute_step(device, corrupt=env.get(CORRUPT_ENV) == "1"))


def disagreeing_ranks(digests: Mapping[int, str]) -> list[int]:
    """Ranks whose digest differs from the majority's. With no strict majority (a tie), every rank
    is suspect: there is no way to tell which side computed right."""
    if len(digests) < 2:
        return []
    counts = Counter(digests.values()).most_common()
    if len(counts) == 1:
        return []
    if len(counts) > 1 and counts[0][1] == counts[1][1]:
        return sorted(digests)
    majority = counts[0][0]
    return sorted(r for r, d in digests.items() if d != majority)
