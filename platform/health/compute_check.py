"""A deterministic compute check: one training step of a fixed-weight model on a fixed input.

Every rank computes the same thing, so every rank's result must be bitwise identical; a rank that
differs has a device that computes wrong without saying so (silent data corruption). The weights and
input are closed-form functions of their index, not random, so no RNG state or library version can
change them.

The arithmetic is exact: every value is a small multiple of a power of two, the loss is a sum, the
learning rate a power of two and the activation a ReLU, so every product and every partial sum fits
in float32's 24-bit mantissa. The result then does not depend on the order a kernel adds in, its
blocking, its threads or its inputs' memory alignment (MKL's float results do, unless `MKL_CBWR` is
set): a controller's process and a check rank get the same bits, which a reference that breaks a
tie relies on. A unit test checks the bound.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Mapping

import torch

CORRUPT_ENV = "STALWART_FAULT_CORRUPT_COMPUTE"  # fault injection: "1" flips a bit in this rank's result

IN, HIDDEN, OUT, BATCH = 64, 128, 32, 16
LR = 2.0**-6  # a power of two: the update is exact
STEP = 2.0**-3  # the weights and inputs are multiples of this, from -2 to 2 of them


def fixed(shape: tuple[int, ...], phase: int, device: torch.device) -> torch.Tensor:
    """Integers from -2 to 2 times STEP, spread by a quadratic in the index (no period shorter than
    the tensor's rows)."""
    n = 1
    for s in shape:
        n *= s
    idx = torch.arange(n, dtype=torch.int64)
    k = (idx * idx * 7 + idx * 3 + phase * 13) % 5 - 2
    return (k.to(torch.float32) * STEP).reshape(shape).to(device)


def reference_model(device: torch.device) -> torch.nn.Sequential:
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(fixed(tuple(p.shape), i, torch.device("cpu")))
    return model.to(device)


def compute_step(device: torch.device, corrupt: bool = False) -> torch.Tensor:
    """Forward, backward and one SGD step; the output and the updated weights, flattened."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = reference_model(device)
    x = fixed((BATCH, IN), 10, device)
    target = fixed((BATCH, OUT), 20, device)
    out = model(x)
    loss = torch.nn.functional.mse_loss(out, target, reduction="sum")  # gradient 2 * (out - target): exact
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
