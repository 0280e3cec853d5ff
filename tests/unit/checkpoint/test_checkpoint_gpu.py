"""GPU state is saved through pinned staging buffers and loaded back into GPU tensors in place.

Found on an H100 (docs/gpu.md): loading into CUDA tensors failed with "can't convert cuda:0 device
type tensor to numpy", the reader reading a whole shard straight into the target's memory as if it
were the host's. These tests need a GPU: they are skipped on machines without one (CI's), and were
run on the H100.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stalwart.checkpoint import Checkpointer, open_storage

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here")


def state(device: str, fill: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"weight": (1024, 256), "bias": (256,), "step": ()}
    out = {k: torch.randn(s, generator=g) if fill else torch.zeros(s) for k, s in shapes.items()}
    return {k: v.to(device) for k, v in out.items()}


def test_a_checkpoint_saved_from_the_host_loads_into_gpu_tensors(tmp_path: Path) -> None:
    saved = state("cpu", fill=True)
    ckpt = Checkpointer(open_storage(str(tmp_path)))
    assert ckpt.save({"model": saved}, 1).wait().committed
    target = state("cuda", fill=False)
    assert ckpt.load({"model": target}, step=1) == 1
    for key, tensor in target.items():
        assert tensor.is_cuda and torch.equal(tensor.cpu(), saved[key]), key
    ckpt.close()


def test_gpu_state_round_trips_through_pinned_staging(tmp_path: Path) -> None:
    saved = state("cuda", fill=True)
    ckpt = Checkpointer(open_storage(str(tmp_path)))
    assert ckpt.save({"model": saved}, 1).wait().committed
    assert ckpt.staging.nbytes > 0 and all(b.is_pinned() for b in ckpt.staging._buffers.values())
    on_host, on_gpu = state("cpu", fill=False), state("cuda", fill=False)
    ckpt.load({"model": on_host}, step=1)
    ckpt.load({"model": on_gpu}, step=1)
    for key, tensor in saved.items():
        assert torch.equal(on_host[key], tensor.cpu()) and torch.equal(on_gpu[key], tensor), key
    ckpt.close()
