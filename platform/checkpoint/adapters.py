"""Stateful adapters: what a training script hands the engine for its model and optimizer.

`get_state_dict`/`set_state_dict` understand plain modules, DDP, FSDP2 and tensor-parallel DTensor
modules alike, so one adapter serves every wrapping; the engine sees DTensors and plans from them.

`get_state_dict` recomputes every parameter's name on each call, most of the time a save blocks
the training loop for. For a model whose tensors are all plain (no DTensor, no FSDP), TrainState
learns the names from its first call, checks that the module's and optimizer's own state dicts,
renamed, give exactly the same entries, and from then on builds the state dict from those: the
same keys and tensors, a fraction of the time. Any mismatch (a new parameter group, a new buffer)
falls back to `get_state_dict` and learns again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor


class TrainState:
    """A model and its optimizer as one Stateful."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self._names: _LearnedNames | None = None

    def state_dict(self) -> dict[str, Any]:
        if self._names is not None:
            fast = self._names.state_dict(self.model, self.optimizer)
            if fast is not None:
                return fast
        optimizers = [self.optimizer] if self.optimizer is not None else []
        model_sd, optim_sd = get_state_dict(self.model, optimizers)
        slow = {"model": model_sd, "optim": optim_sd} if self.optimizer is not None else {"model": model_sd}
        self._names = _LearnedNames.learn(self.model, self.optimizer, slow)
        return slow

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


class _LearnedNames:
    """The names `get_state_dict` gives a plain model's entries, in the order the module's and the
    optimizer's own state dicts list them."""

    def __init__(self, model_keys: dict[str, str], param_names: list[str]) -> None:
        self.model_keys = model_keys  # module.state_dict() key -> get_state_dict's name
        self.param_names = param_names  # the optimizer's parameter index -> its name

    @classmethod
    def learn(
        cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, slow: dict[str, Any]
    ) -> _LearnedNames | None:
        """The names, when renaming the own state dicts gives exactly `slow`; else None."""
        if not _all_plain(model):
            return None
        raw = model.state_dict()
        if len(raw) != len(slow["model"]):
            return None
        model_keys = dict(zip(raw, slow["model"], strict=True))
        if any(not _same(raw[k], slow["model"][name]) for k, name in model_keys.items()):
            return None
        param_names: list[str] = []
        if optimizer is not None:
            param_names = [name for group in slow["optim"].get("param_groups", []) for name in group["params"]]
        names = cls(model_keys, param_names)
        fast = names.state_dict(model, optimizer)
        return names if fast is not None and _same(fast, slow) else None

    def state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any] | None:
        """The state dict from the module's and optimizer's own, renamed; None when they no longer match."""
        raw = model.state_dict()
        if raw.keys() != self.model_keys.keys():
            return None
        out: dict[str, Any] = {"model": {self.model_keys[k]: v for k, v in raw.items()}}
        if optimizer is None:
            return out
        if (
            sum(len(group["params"]) for group in optimizer.param_groups) != len(self.param_names)
            or not optimizer.state
        ):
            return None  # a new parameter group, or no state yet (get_state_dict creates it)
        own = optimizer.state_dict()
        names = self.param_names
        out["optim"] = {
            "state": {names[i]: per_param for i, per_param in own["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in own["param_groups"]],
        }
        return out


def _all_plain(model: torch.nn.Module) -> bool:
    """Only plain tensors (no DTensor, no FSDP flat parameter): their names never change."""
    tensors = [*model.parameters(), *model.buffers()]
    return all(type(t) in (torch.Tensor, torch.nn.Parameter) and not isinstance(t, DTensor) for t in tensors)


def _same(a: Any, b: Any) -> bool:
    """The same entries: equal keys and values, tensors sharing their storage, shape and dtype."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
            and a.data_ptr() == b.data_ptr()
        )
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
