"""The short form: `save(state, uri, step)`, `load(state, uri, step=None)`, `latest(uri)`.

One Checkpointer per URI per process, created on first use (collectively, when distributed), so
its staging buffers and cached plan are reused from one save to the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stalwart.checkpoint.engine import Checkpointer, SaveHandle
from stalwart.checkpoint.storage import open_storage

_checkpointers: dict[str, Checkpointer] = {}


def checkpointer(uri: str) -> Checkpointer:
    if uri not in _checkpointers:
        _checkpointers[uri] = Checkpointer(open_storage(uri))
    return _checkpointers[uri]


def save(state: Mapping[str, Any], uri: str, step: int, *, blocking: bool = False) -> SaveHandle:
    """Async by default: returns once the state is staged; `handle.wait()` gives the SaveResult."""
    return checkpointer(uri).save(state, step, blocking=blocking)


def load(state: Mapping[str, Any], uri: str, step: int | None = None, *, fallback: bool = False) -> int:
    """Load in place; returns the step loaded. Raises NoCheckpoint when there is none."""
    return checkpointer(uri).load(state, step, fallback=fallback)


def latest(uri: str) -> int | None:
    """The newest committed step at `uri`, or None. Needs no process group."""
    return max(Checkpointer.committed_steps(open_storage(uri)), default=None)
