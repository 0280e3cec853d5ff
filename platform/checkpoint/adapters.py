"""Stateful adapters: what a training script hands the engine for its model and optimizer.

`get_state_dict`/`set_state_dict` understand plain modules, DDP, FSDP2 and tensor-parallel DTensor
modules alike, so one adapter serves every wrapping; the engine sees DTensors and plans from them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


class TrainState:
    """A model and its optimizer as one Stateful."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        optimizers = [self.optimizer] if self.optimizer is not None else []
        model_sd, optim_sd = get_state_dict(self.model, optimizers)
        return {"model": model_sd, "optim": optim_sd} if self.optimizer is not None else {"model": model_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        optimizers = [self.optimizer] if self.optimizer is not None else []
        set_state_dict(self.model, optimizers, model_state_dict=state["model"], optim_state_dict=state.get("optim", {}))


class RNGState:
    """The CPU (and CUDA) random generators, so a resumed run draws the same numbers."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["cpu"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])
