"""Megatron-core's sharded state dicts, saved and loaded by the Stalwart engine, in any layout.

Megatron describes a model's and an optimizer's state as a `sharded_state_dict`: nested dicts
and lists whose leaves are ShardedTensors (a local box of a global tensor, with a replica id),
ShardedObjects (a Python value, one per shard of a grid), ShardedTensorFactories (transforms
applied before saving and undone after loading), LocalNonpersistentObjects (never saved), and
plain values (saved once, loaded everywhere). This maps them onto the engine:

    ShardedTensor    -> a GlobalShard under its key: replicas are written once, spread over the
                        ranks that hold them, and a load in another TP/PP/DP layout reads the
                        overlapping boxes (the layer axes Megatron prepends are kept);
    ShardedObject    -> a value under its unique key (key/shard_offsets_shape): plain data only;
    plain values     -> a value under their path in the dict;

    from stalwart.checkpoint import Checkpointer, megatron
    sd = {"model": model.sharded_state_dict(), "optimizer": optimizer.sharded_state_dict(...)}
    megatron.save(ckpt, sd, step)
    step, state_dict = megatron.load(ckpt, sd)            # same structure, tensors filled in place
    model.load_state_dict(state_dict["model"])

as `megatron.core.dist_checkpointing.save/load` do. Megatron's `flattened_range` (gone in 0.16)
and `allow_shape_mismatch` across a change of the global shape are refused with a clear error.
"""

from __future__ import annotations

from typing import Any

from stalwart.checkpoint.engine import Checkpointer, SaveHandle
from stalwart.checkpoint.errors import CheckpointError
from stalwart.checkpoint.shards import GlobalShard

_ROOT = "megatron"


def _path_key(path: tuple[str | int, ...]) -> str:
    return "common/" + "/".join(map(str, path))


def _flatten(sharded: Any) -> tuple[dict[str, Any], list[tuple[tuple[str | int, ...], str, Any]]]:
    """The engine's state ({name: GlobalShard | value}) and, per leaf, (path, name, Megatron leaf)."""
    from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject, ShardedObject, ShardedTensor

    state: dict[str, Any] = {}
    leaves: list[tuple[tuple[str | int, ...], str, Any]] = []

    def walk(node: Any, path: tuple[str | int, ...]) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, (*path, i))
        elif isinstance(node, ShardedTensor):
            if node.flattened_range is not None:
                raise CheckpointError(f"{node.key}: flattened_range shards are not supported")
            if node.data is None:
                raise CheckpointError(f"{node.key}: a ShardedTensor without data")
            local = node.data.view(*([1] * node.prepend_axis_num), *node.local_shape)  # Megatron's layer axes
            if isinstance(held := state.get(node.key), GlobalShard):
                held.add(local, tuple(node.global_offset))  # another layer of a stacked tensor
            else:
                state[node.key] = GlobalShard(local, tuple(node.global_shape), tuple(node.global_offset))
            leaves.append((path, node.key, node))
        elif isinstance(node, ShardedObject):
            state[node.unique_key] = node.data
            leaves.append((path, node.unique_key, node))
        elif isinstance(node, LocalNonpersistentObject):
            leaves.append((path, "", node))
        else:
            name = _path_key(path)
            state[name] = node
            leaves.append((path, name, node))

    walk(sharded, ())
    return state, leaves


def _set(tree: Any, path: tuple[str | int, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _copy_structure(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _copy_structure(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy_structure(v) for v in node]
    return node


def save(ckpt: Checkpointer, sharded_state_dict: dict[str, Any], step: int, *, blocking: bool = False) -> SaveHandle:
    """Save a Megatron sharded state dict (every rank calls it, as for dist_checkpointing.save)."""
    from megatron.core.dist_checkpointing.mapping import apply_factories

    sharded = _copy_structure(sharded_state_dict)
    apply_factories(sharded)
    state, _ = _flatten(sharded)
    return ckpt.save({_ROOT: state}, step, blocking=blocking)


def load(
    ckpt: Checkpointer, sharded_state_dict: dict[str, Any], step: int | None = None, *, fallback: bool = False
) -> tuple[int, dict[str, Any]]:
    """Load into the ShardedTensors' tensors in place, in this rank's layout, whatever the saving
    one. Returns (step, state dict): the same structure with every ShardedTensor replaced by its
    loaded tensor and every ShardedObject by its value, factories merged back."""
    from megatron.core.dist_checkpointing.dict_utils import extract_matching_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory, apply_factories, apply_factory_merges

    sharded = _copy_structure(sharded_state_dict)
    factories, _ = extract_matching_values(sharded, lambda x: isinstance(x, ShardedTensorFactory))
    apply_factories(sharded)
    state, leaves = _flatten(sharded)
    holder = {_ROOT: state}
    try:
        loaded = ckpt.load(holder, step, fallback=fallback)
    except RuntimeError as exc:
        if "Size mismatch" in str(exc) or "size mismatch" in str(exc):
            raise CheckpointError(f"a Megatron tensor's global shape changed since the save: {exc}") from exc
        raise
    out = sharded
    for path, name, leaf in leaves:
        if not path:
            continue
        if name == "":  # LocalNonpersistentObject: this process's own value
            _set(out, path, leaf.unwrap())
        elif isinstance(state[name], GlobalShard):
            _set(out, path, leaf.data)  # filled in place
        else:
            _set(out, path, holder[_ROOT][name])
    if factories:
        out = apply_factory_merges(out, factories)
    return loaded, out
