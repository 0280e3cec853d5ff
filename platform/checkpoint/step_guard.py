"""Hold an optimizer's step until the checkpoint has staged the tensors that step would modify.

A save returns before the parameters and the optimizer's moments are copied: they are copied in
the background while the next forward and backward run (which read them, never write them). The
first thing that writes them is the optimizer's step, so each watched optimizer gets a step
pre-hook that waits for exactly its own tensors to be staged, and only while a save is staging
them. A training loop that takes longer than the copy never waits at all.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from stalwart.checkpoint.staging import StagingBuffers


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding a DTensor's local shard (the wrapper itself has no storage)."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


@functools.lru_cache(maxsize=64)
def _device_name(device: torch.device) -> str:
    return str(device)


def storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    """Tensors sharing storage (views, a state dict's entries and the parameters) share this key;
    None for a tensor without storage of its own (it is then never deferred). Called for every
    tensor of every save on the training thread: plain tensors take the short way."""
    local = t if type(t) is torch.Tensor or type(t) is torch.nn.Parameter else _local(t)
    try:
        return (_device_name(local.device), local.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return None


class Gate:
    """Opens once a save has staged one optimizer's tensors (or gave up on them)."""

    def __init__(self) -> None:
        self._opened = threading.Event()
        self._events: list[Any] = []  # CUDA: the copies' events, waited on by the training stream
        self.waited_seconds = 0.0  # how long steps were held at this gate

    def open(self, events: list[Any] | None = None) -> None:
        self._events = events or []
        self._opened.set()

    def is_open(self) -> bool:
        return self._opened.is_set()

    def wait(self) -> None:
        self._opened.wait()
        StagingBuffers.wait_on_device(self._events)


class StepGuard:
    def __init__(self) -> None:
        self._watched: dict[int, tuple[weakref.ref[torch.optim.Optimizer], RemovableHandle]] = {}
        self._gates: dict[int, Gate] = {}
        self._lock = threading.Lock()

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._watched and self._watched[id(optimizer)][0]() is optimizer:
            return
        handle = optimizer.register_step_pre_hook(self._before_step)
        self._watched[id(optimizer)] = (weakref.ref(optimizer), handle)

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for ref, _ in self._watched.values() if (o := ref()) is not None]

    def owners(self) -> dict[tuple[str, int], int]:
        """Storage key -> id of the watched optimizer whose step writes it (parameters, moments...)."""
        out: dict[tuple[str, int], int] = {}
        for opt in self.optimizers():
            tensors = [p for group in opt.param_groups for p in group["params"]]
            tensors += [
                v for per_param in opt.state.values() for v in per_param.values() if isinstance(v, torch.Tensor)
            ]
            for t in tensors:
                if (key := storage_key(t)) is not None:
                    out.setdefault(key, id(opt))
        return out

    def arm(self, gates: dict[int, Gate]) -> None:
        with self._lock:
            self._gates = gates

    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        with self._lock:
            gate = self._gates.get(id(optimizer))
        if gate is None:
            return
        if gate.is_open():
            gate.wait()  # on a GPU: the step's stream waits for the copies; the host does not
            return
        t0 = time.perf_counter()
        gate.wait()
        gate.waited_seconds += time.perf_counter() - t0

    def close(self) -> None:
        for _, handle in self._watched.values():
            handle.remove()
        self._watched.clear()
        for gate in self._gates.values():
            gate.open()
