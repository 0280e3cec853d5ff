"""DCP's save planner, with replicated shards spread evenly over the ranks that hold them.

DCP already writes each replicated item once; it assigns items in dictionary order to the
least-loaded holder. Assigning the largest items first (LPT) balances bytes better, which matters
because the slowest rank sets the checkpoint's duration.
"""

from __future__ import annotations

import dataclasses
import io
from collections import defaultdict
from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint._sharded_tensor_utils import _flatten_sharded_tensors
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import ReadItem, SavePlan, WriteItem, WriteItemType

from stalwart.checkpoint import objects
from stalwart.checkpoint.shards import GlobalShard


def item_bytes(item: WriteItem) -> int:
    return item.tensor_storage_size() or 1


def balance_replicas(all_plans: list[SavePlan]) -> list[SavePlan]:
    """Keep each item in exactly one plan: largest first, each to its least-loaded holder."""
    holders: dict[MetadataIndex, list[int]] = defaultdict(list)
    items: dict[MetadataIndex, WriteItem] = {}
    for rank, plan in enumerate(all_plans):
        for item in plan.items:
            holders[item.index].append(rank)
            items[item.index] = item
    load = [0] * len(all_plans)
    owner: dict[MetadataIndex, int] = {}
    # Items held by one rank have no choice: place them first so the greedy step sees their load.
    for index, ranks in holders.items():
        if len(ranks) == 1:
            owner[index] = ranks[0]
            load[ranks[0]] += item_bytes(items[index])
    shared = sorted(
        (i for i, r in holders.items() if len(r) > 1),
        key=lambda i: (-item_bytes(items[i]), i.fqn, tuple(i.offset or ())),
    )
    for index in shared:
        rank = min(holders[index], key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += item_bytes(items[index])
    return [
        dataclasses.replace(plan, items=[it for it in plan.items if owner[it.index] == rank])
        for rank, plan in enumerate(all_plans)
    ]


class BalancedSavePlanner(DefaultSavePlanner):
    def __init__(self) -> None:
        super().__init__(flatten_sharded_tensors=False)  # done in set_up_planner, only when needed

    def set_up_planner(
        self, state_dict: dict[str, Any], storage_meta: Any = None, is_coordinator: bool = False
    ) -> None:
        """DCP's set-up, without its second walk of the whole state dict for ShardedTensors (a save's
        time on the training thread) when the flattened state holds none."""
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        if any(isinstance(v, ShardedTensor) for v in self.state_dict.values()):
            self.state_dict = _flatten_sharded_tensors(self.state_dict)

    def _dedup_save_plans(self, all_plans: list[SavePlan]) -> list[SavePlan]:
        return balance_replicas(all_plans)

    def lookup_object(self, index: MetadataIndex) -> Any:
        # DCP asks only torch.Tensor subclasses for their shard; a GlobalShard answers too.
        obj = self.state_dict.get(index.fqn)
        return obj.__get_tensor_shard__(index) if isinstance(obj, GlobalShard) else super().lookup_object(index)

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:
        if write_item.type == WriteItemType.BYTE_IO:
            return objects.serialize(write_item.index.fqn, object)  # plain data only, or refused
        return object


def _pop_shards(tree: dict[str, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], GlobalShard]:
    found: dict[tuple[str, ...], GlobalShard] = {}
    for key, value in tree.items():
        if isinstance(value, GlobalShard):
            found[(*path, key)] = value
            tree[key] = 0  # a placeholder DCP leaves alone
        elif isinstance(value, dict):
            found.update(_pop_shards(value, (*path, key)))
    return found


class ShardAwareLoadPlanner(DefaultLoadPlanner):
    def set_up_planner(self, state_dict: dict[str, Any], metadata: Any = None, is_coordinator: bool = False) -> None:
        # DCP's set-up rewrites every leaf it does not know as None; keep GlobalShards out of its way.
        shards = _pop_shards(state_dict)
        super().set_up_planner(state_dict, metadata, is_coordinator)
        for path, shard in shards.items():
            node = state_dict
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = shard
        for fqn, mapped in self.mappings.items():
            if (where := tuple(str(k) for k in mapped)) in shards:
                self.state_dict[fqn] = shards[where]

    def load_value(self, read_item: ReadItem, value: Any) -> None:
        """A non-tensor value, already read back as plain data (see stalwart.checkpoint.objects)."""
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], value)
        else:
            self.state_dict[read_item.dest_index.fqn] = value

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        # DCP's own unpickles with weights_only=False: never here.
        self.load_value(read_item, objects.deserialize(read_item.dest_index.fqn, value.getvalue(), "the checkpoint"))

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        obj = self.state_dict.get(index.fqn)
        return obj.__get_tensor_shard__(index) if isinstance(obj, GlobalShard) else super().lookup_tensor(index)
