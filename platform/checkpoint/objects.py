"""Non-tensor values in a checkpoint (RNG state, a loader's counters, optimizer settings): plain data only.

They are stored as DCP stores them (torch.save), but only what `torch.load(weights_only=True)`
reads back is allowed in: on save, anything else is refused with the name of the value and the
type that is not allowed; on load they are read with the weights-only unpickler, which builds
containers, numbers, strings and tensors and calls nothing else. A checkpoint tampered with to
carry code is refused, and nothing of it runs.
"""

from __future__ import annotations

import copy
import io
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from stalwart.checkpoint.errors import UnsafeObjectError

_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.Size, torch.dtype, torch.device)
_CONTAINERS = (list, tuple, set, dict, OrderedDict)
_MAX_DEPTH = 64


def _check(value: Any, where: str, depth: int) -> None:
    kind = type(value)  # exact types: a subclass (a namedtuple, an IntEnum) needs its class to load
    if kind in _LEAVES:
        return
    if kind is torch.Tensor or kind is torch.nn.Parameter:
        if value.layout != torch.strided or value.is_quantized or value.is_meta:
            raise UnsafeObjectError(f"{where}: a {value.layout} tensor cannot be saved as a plain value")
        return
    if kind not in _CONTAINERS:
        name = f"{kind.__module__}.{kind.__qualname__}"
        raise UnsafeObjectError(
            f"{where}: a value of type {name} cannot be saved in a checkpoint (only numbers, strings, "
            "bytes, tensors and lists, tuples, sets and dicts of them: loading anything else would run "
            "code). Convert it in your state_dict(), e.g. a numpy array to a tensor or a list."
        )
    if depth >= _MAX_DEPTH:
        raise UnsafeObjectError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            _check(k, f"{where} (a key)", depth + 1)
            _check(v, f"{where}[{k!r}]", depth + 1)
    else:
        for i, v in enumerate(value):
            _check(v, f"{where}[{i}]", depth + 1)


def check_plain(fqn: str, value: Any) -> None:
    """Raise UnsafeObjectError unless `value` is plain data that loads without running code."""
    _check(value, repr(fqn), 0)


@dataclass(frozen=True)
class Snapshot:
    """A plain value as it was when a save began, serialized later (off the training thread): a
    deep copy costs a fraction of torch.save's in-memory zip, and the save's blocking part pays it."""

    fqn: str
    value: Any

    def serialize(self) -> io.BytesIO:
        out = io.BytesIO()
        torch.save(self.value, out)
        out.seek(0)
        return out


def snapshot(fqn: str, value: Any) -> Snapshot:
    """Refuse a value that is not plain data now (every rank's save fails at once), copy it."""
    check_plain(fqn, value)
    return Snapshot(fqn, copy.deepcopy(value))


def serialize(fqn: str, value: Any) -> io.BytesIO:
    check_plain(fqn, value)
    out = io.BytesIO()
    torch.save(value, out)
    out.seek(0)
    return out


def deserialize(fqn: str, data: bytes, where: str) -> Any:
    """Read a stored value with the weights-only unpickler; anything else is refused, not run."""
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # the unpickler's refusal, or bytes that are not a torch.save at all
        reason = str(exc).split("\n")[-1].strip() or type(exc).__name__
        raise UnsafeObjectError(
            f"value {fqn!r} in {where} is not plain data and was refused, unrun ({reason[:300]})"
        ) from None
