"""A save costs the loop almost nothing, and never a torn tensor (issue 22).

save() returns before the parameters and optimizer moments are copied; the optimizer's next step
waits for them. Here the background copy is slowed down so that the step surely comes first: the
checkpoint must still hold the values of the moment save() was called, bit for bit.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from stalwart.checkpoint import Checkpointer, TrainState, open_storage
from stalwart.checkpoint.staging import StagingBuffers
from stalwart.checkpoint.step_guard import Gate


def flat(state: dict, prefix: str = "") -> dict[str, torch.Tensor]:  # type: ignore[type-arg]
    out = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        elif isinstance(v, torch.Tensor):
            out[f"{prefix}{k}"] = v.detach().clone()
    return out


def model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(8, 32)).sum().backward()
    optim.step()
    return model, optim


@pytest.mark.parametrize("overlap", [True, False])
def test_a_step_right_after_save_never_tears_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    original_stage, original_wait = StagingBuffers.stage, Gate.wait
    step_waits = threading.Event()

    def held_in_the_background(self: StagingBuffers, index, src):  # type: ignore[no-untyped-def]
        # With overlap, the copy is held until the step is at its gate, so the step surely comes
        # first however loaded the machine is; without, slowed as before (nothing waits on it).
        if threading.current_thread().name == "ckpt-stage":
            if overlap:
                step_waits.wait(timeout=60)
            else:
                time.sleep(0.02)
        return original_stage(self, index, src)

    def waiting(self: Gate) -> None:
        step_waits.set()
        original_wait(self)

    monkeypatch.setattr(StagingBuffers, "stage", held_in_the_background)
    monkeypatch.setattr(Gate, "wait", waiting)
    model, optim = model_and_optimizer(0)
    ckpt = Checkpointer(open_storage(str(tmp_path)), overlap=overlap)
    state = {"train": TrainState(model, optim)}
    before = flat(TrainState(model, optim).state_dict())

    handle = ckpt.save(state, 1)
    model(torch.randn(8, 32)).sum().backward()  # the next step: forward updates BatchNorm's statistics...
    optim.step()  # ...and the step writes the parameters and moments, at once
    result = handle.wait()
    assert result.committed, result.error
    moved = flat(TrainState(model, optim).state_dict())
    assert not torch.equal(moved["model.0.weight"], before["model.0.weight"])
    assert not torch.equal(moved["model.1.running_mean"], before["model.1.running_mean"])
    if overlap:
        assert result.step_wait_seconds > 0  # the copy was held: the step waited for it, and only the step
        assert step_waits.is_set()

    fresh, fresh_optim = model_and_optimizer(1)
    ckpt.load({"train": TrainState(fresh, fresh_optim)})
    loaded = flat(TrainState(fresh, fresh_optim).state_dict())
    assert loaded.keys() == before.keys()
    torn = [k for k, v in before.items() if not torch.equal(loaded[k], v)]
    assert torn == [], torn
    ckpt.close()


def test_a_loop_that_outlasts_the_copy_never_waits(tmp_path: Path) -> None:
    model, optim = model_and_optimizer(0)
    ckpt = Checkpointer(open_storage(str(tmp_path)))
    state = {"train": TrainState(model, optim)}
    ckpt.save(state, 1).wait()  # plans, and allocates the staging buffers
    handle = ckpt.save(state, 2)
    handle.wait_staged()  # a forward and backward longer than the copy
    optim.step()
    assert handle.wait().step_wait_seconds == 0.0
    ckpt.close()
