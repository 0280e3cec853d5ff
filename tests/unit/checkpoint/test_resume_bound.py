"""A rollback is honoured by Checkpointer.load itself: with no step given, nothing newer than the
bound the agent set (STALWART_RESUME_MAX_STEP) is loaded, whatever the training script does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stalwart import worker_contract as contract
from stalwart.checkpoint import Checkpointer, NoCheckpoint, open_storage


def test_load_takes_the_newest_checkpoint_the_rollback_allows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = Checkpointer([open_storage(str(tmp_path / "ckpt"))])
    try:
        for step in (10, 20, 30):
            ckpt.save({"w": torch.full((4,), float(step))}, step).wait()
        state = {"w": torch.zeros(4)}
        assert ckpt.load(state) == 30
        monkeypatch.setenv(contract.RESUME_MAX_STEP, "25")
        assert ckpt.load(state) == 20 and state["w"][0].item() == 20.0
        assert ckpt.load(state, 30) == 30  # an explicit step is the caller's choice
        monkeypatch.setenv(contract.RESUME_MAX_STEP, "5")
        with pytest.raises(NoCheckpoint):
            ckpt.load(state)
    finally:
        ckpt.close()
