"""Convert a torchsnapshot snapshot into a Stalwart checkpoint (one process, no collectives).

Logical paths become DCP fully-qualified names ('0/model/weight' -> 'model.weight'), which are the
names DCP gives the same state when a training script saves {'model': model.state_dict(), ...}.
Entries saved per rank by torchsnapshot (not replicated) keep their rank: 'rank1.model.weight'.
"""

from __future__ import annotations

from typing import Any

from stalwart.checkpoint.engine import Checkpointer, SaveResult
from stalwart.checkpoint.storage.base import Storage

_CONTAINERS = {"DictEntry", "OrderedDictEntry", "ListEntry"}


def read_torchsnapshot(path: str) -> dict[str, Any]:
    """Every leaf of the snapshot, under its DCP name."""
    try:
        from torchsnapshot import Snapshot
    except ImportError as exc:  # an optional dependency
        raise RuntimeError("torchsnapshot is not installed: pip install 'stalwart[torchsnapshot]'") from exc
    import logging
    import warnings

    # It logs "does not support in-place load" for every object: we want the value, not the warning.
    logging.getLogger("torchsnapshot").setLevel(logging.ERROR)
    snapshot = Snapshot(path)
    try:
        manifest = snapshot.get_manifest()
    except Exception as exc:
        raise ValueError(f"{path} is not a readable torchsnapshot snapshot: {exc}") from exc
    out: dict[str, Any] = {}
    for logical, entry in manifest.items():
        if type(entry).__name__ in _CONTAINERS:
            continue
        rank, _, rest = logical.partition("/")
        name = rest.replace("/", ".")
        if rank != "0" and rank.isdigit():
            name = f"rank{rank}.{name}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[name] = snapshot.read_object(logical)
    return out


def import_torchsnapshot(src: str, dst: Storage, step: int) -> SaveResult:
    state = read_torchsnapshot(src)
    if not state:
        raise ValueError(f"{src}: the snapshot holds no entries")
    checkpointer = Checkpointer(dst)
    return checkpointer.save(state, step, blocking=True).wait()
