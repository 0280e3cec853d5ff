"""Checkpoint scenarios run by real ranks (torchrun-style env), driven by tests/test_checkpoint_*.py.

    python ckpt_worker.py SCENARIO ROOT [KEY=VALUE ...]

Each scenario writes rank-R.json with its findings into ROOT/results/ for the test to read.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from stalwart.checkpoint import Checkpointer, RetentionPolicy, open_storage
from stalwart.checkpoint.adapters import TrainState
from stalwart.checkpoint.storage import FileStorage

SHAPES = {"w1": (64, 48), "w2": (33, 17), "bias": (100,), "scalar": ()}
if os.environ.get("CKPT_BIG") == "1":  # several checksum blocks per shard, for counting bytes read
    SHAPES = {"w1": (2048, 1024), "w2": (1024, 512), "bias": (4096,), "scalar": ()}


def reference() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}


class SlowFileStorage(FileStorage):
    """A disk that takes its time, so a test can kill a save while it is being written."""

    writing = threading.Event()  # the slow save's first write has begun

    def open_writer(self, path: str):  # type: ignore[no-untyped-def]
        inner = super().open_writer(path)
        if not path.startswith("step-0000000020/"):
            return inner  # only the save the test kills is slow
        original = inner.write

        def slow_write(data):  # type: ignore[no-untyped-def]
            self.writing.set()
            time.sleep(0.5)
            return original(data)

        inner.write = slow_write  # type: ignore[method-assign]
        return inner


def placements_for(layout: str, world: int):  # type: ignore[no-untyped-def]
    """layout: 'dp4' (FSDP-style Shard(0) over 4), 'tp2xdp2', 'tp2', 'single', 'rep4'."""
    if layout == "single":
        return None, None
    if layout == "tp2xdp2":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        return mesh, {
            "w1": [Replicate(), Shard(0)],
            "w2": [Replicate(), Shard(1)],
            "bias": [Shard(0), Shard(0)],
            "scalar": [Replicate(), Replicate()],
        }
    if layout == "tp2xfsdp2":
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        return mesh, {
            "w1": [Shard(0), Shard(1)],
            "w2": [Shard(1), Shard(0)],
            "bias": [Shard(0), Replicate()],
            "scalar": [Replicate(), Replicate()],
        }
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    if layout == "rep":
        return mesh, {k: [Replicate()] for k in SHAPES}
    return mesh, {k: [Shard(0)] if SHAPES[k] else [Replicate()] for k in SHAPES}  # dpN: FSDP-style


def dtensor_state(layout: str, world: int, fill: float | None) -> dict:  # type: ignore[type-arg]
    ref = reference()
    mesh, placements = placements_for(layout, world)
    state = {}
    for k, t in ref.items():
        src = t if fill is None else torch.full_like(t, fill)
        state[k] = src.clone() if mesh is None else distribute_tensor(src, mesh, placements[k])
    return state


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def write_result(root: Path, payload: dict) -> None:  # type: ignore[type-arg]
    out = root / "results"
    out.mkdir(parents=True, exist_ok=True)
    rank = dist.get_rank() if dist.is_initialized() else 0
    (out / f"rank-{rank}.json").write_text(json.dumps(payload))


def tiers(root: Path, opts: dict[str, str]) -> list:  # type: ignore[type-arg]
    uris = opts.get("uri", str(root / "ckpt")).split(",")
    rank = dist.get_rank() if dist.is_initialized() else 0
    # Memory tiers name each rank's node's store and its peer: "mem://{node}/ns" with nodes=A|B, peers=B|A.
    if "nodes" in opts:
        nodes, peers = opts["nodes"].split("|"), opts["peers"].split("|")
        uris = [u.replace("{node}", nodes[rank % len(nodes)]).replace("{peer}", peers[rank % len(peers)]) for u in uris]
    return [open_storage(u) for u in uris]


# --------------------------------------------------------------------------------------------
def reshard_save(root: Path, opts: dict[str, str]) -> None:
    ck = Checkpointer(tiers(root, opts), parallelism={"layout": 1})
    state = dtensor_state(opts["layout"], dist.get_world_size(), None)
    result = ck.save({"tensors": state, "meta": {"note": "hello", "step": 11}}, int(opts.get("step", "10"))).wait()
    write_result(root, result.model_dump())


def reshard_load(root: Path, opts: dict[str, str]) -> None:
    world = dist.get_world_size() if dist.is_initialized() else 1
    storages = tiers(root, opts)
    ck = Checkpointer(storages)
    state = dtensor_state(opts["layout"], world, fill=0.0)
    holder = {"tensors": state, "meta": {"note": "", "step": 0}}
    step = ck.load(holder, fallback=opts.get("fallback") == "1")
    ref = reference()
    equal = {k: bool(torch.equal(full(state[k]), ref[k])) for k in ref}
    write_result(
        root, {"step": step, "equal": equal, "meta": holder["meta"], "bytes_read": sum(s.bytes_read for s in storages)}
    )


# --------------------------------------------------------------------------------------------
def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def wrapped(kind: str, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = make_model()
    if kind == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    elif kind == "tp_fsdp2":
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
    optim = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(seed + 1)
    model(torch.randn(4, 16)).sum().backward()
    optim.step()
    optim.zero_grad()
    return model, optim


def flat_full(sd: dict, prefix: str = "") -> dict[str, torch.Tensor]:  # type: ignore[type-arg]
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update(flat_full(v, f"{prefix}{k}."))
        elif isinstance(v, torch.Tensor):
            out[f"{prefix}{k}"] = full(v).clone()
    return out


def slow_background_copies() -> None:
    """The background copy takes its time, so the step right after a save surely comes first."""
    from stalwart.checkpoint.staging import StagingBuffers

    original = StagingBuffers.stage

    def slow(self, index, src):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "ckpt-stage":
            time.sleep(0.01)
        return original(self, index, src)

    StagingBuffers.stage = slow  # type: ignore[method-assign]


def roundtrip(root: Path, opts: dict[str, str]) -> None:
    """Save, then at once the next step (forward, backward, the optimizer's step): the checkpoint
    holds the state of the moment save() was called, and loads bit for bit."""
    kind = opts["kind"]
    slow_background_copies()
    ck = Checkpointer(tiers(root, opts))
    model, optim = wrapped(kind, seed=1)
    before = flat_full(TrainState(model, optim).state_dict())
    handle = ck.save({"train": TrainState(model, optim)}, 1)
    model(torch.randn(4, 16)).sum().backward()
    optim.step()
    saved = handle.wait()
    assert saved.committed, saved.error
    model2, optim2 = wrapped(kind, seed=99)  # different weights and optimizer moments
    differs = any(not torch.equal(v, flat_full(TrainState(model2, optim2).state_dict())[k]) for k, v in before.items())
    ck.load({"train": TrainState(model2, optim2)})
    after = flat_full(TrainState(model2, optim2).state_dict())
    equal = {k: bool(torch.equal(v, after[k])) for k, v in before.items()}
    write_result(
        root,
        {"equal": equal, "differed_before_load": differs, "n": len(before), "step_waited": saved.step_wait_seconds > 0},
    )


def megatron_state(tp: int, seed: int) -> tuple[dict, list[torch.nn.Parameter], torch.optim.Optimizer]:  # type: ignore[type-arg]
    """A Megatron GPTModel (local layer spec, 2 layers) in TP=tp over this world, its Adam state after
    one step, and the sharded state dict of both: the model's ShardedTensors (layer-stacked) and
    ShardedObjects, and the optimizer's state in model space, built as Megatron's FP32Optimizer and
    the distributed optimizer's fully_reshardable format build it."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        optim_state_to_sharding_state,
    )
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    torch.manual_seed(seed)
    config = TransformerConfig(
        num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True, pipeline_dtype=torch.float32
    )
    model = GPTModel(
        config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=128, max_sequence_length=32
    )
    params = list(model.parameters())
    optim = torch.optim.Adam(params, lr=0.01)
    for p in params:  # a gradient that is a function of the value: replicas stay equal
        p.grad = p.detach() * 0.5 + 0.1 * seed
    optim.step()
    model_sd = model.sharded_state_dict()
    optim_sd = optim.state_dict()
    id_map = get_param_id_to_sharded_param_map(model_sd, params)
    step = optim_sd["state"][0]["step"]
    optim_state_to_sharding_state(optim_sd, id_map, exclude_keys="step")
    optim_sd["state"]["common_step"] = step
    return {"model": model_sd, "optimizer": optim_sd}, params, optim


def megatron_global(sd: dict) -> dict[str, torch.Tensor]:  # type: ignore[type-arg]
    """Every ShardedTensor assembled whole on every rank (a small model: fine to gather)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    mine = [
        (t.key, t.global_shape, t.global_offset, t.data.view(*([1] * t.prepend_axis_num), *t.local_shape).clone())
        for t in nested_values(sd)
        if isinstance(t, ShardedTensor)
    ]
    parts: list = [None] * dist.get_world_size()  # type: ignore[type-arg]
    dist.all_gather_object(parts, mine)
    out: dict[str, torch.Tensor] = {}
    for part in parts:
        for key, shape, offset, local in part:
            full = out.setdefault(key, torch.zeros(shape, dtype=local.dtype))
            full[tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))] = local
    return out


def megatron(root: Path, opts: dict[str, str]) -> None:
    """Saved by 4 ranks as TP=2 x DP=2, then loaded in the same processes as TP=1 x DP=4 and as
    TP=4 x DP=1: every shard compared bit for bit with the saved global tensors."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    from stalwart.checkpoint import megatron as adapter

    ck = Checkpointer(tiers(root, opts))
    sd, _, _ = megatron_state(2, seed=1)
    reference = megatron_global(sd)
    saved = adapter.save(ck, sd, 3).wait()
    objects = sum(isinstance(v, ShardedObject) for v in nested_values(sd))
    checks: dict[str, object] = {"save": saved.model_dump(), "tensors": len(reference), "objects": objects}
    for tp in (1, 4):
        fresh, _, _ = megatron_state(tp, seed=7)
        before = {t.key: t.data.clone() for t in nested_values(fresh) if isinstance(t, ShardedTensor)}
        step, loaded = adapter.load(ck, fresh)
        equal, changed = {}, 0
        for t in nested_values(fresh):
            if isinstance(t, ShardedTensor):
                box = tuple(
                    slice(o, o + n) for o, n in zip(t.global_offset[t.prepend_axis_num :], t.local_shape, strict=True)
                )
                want = reference[t.key][tuple(t.global_offset[: t.prepend_axis_num])][box]
                equal[t.key] = bool(torch.equal(t.data, want))
                changed += not torch.equal(before[t.key], t.data)
        group = loaded["optimizer"]["param_groups"][0]
        checks[f"tp{tp}"] = {
            "step": step,
            "equal": equal,
            "changed": changed,
            "lr": group["lr"],
            "betas": list(group["betas"]),
            "common_step": float(loaded["optimizer"]["state"]["common_step"]),
        }
    write_result(root, checks)


def slow_save(root: Path, opts: dict[str, str]) -> None:
    """Save step 10 and commit it; then start saving step 20 and report, to be killed mid-save."""
    storage = SlowFileStorage(root / "ckpt")
    ck = Checkpointer([storage])
    state = {"tensors": dtensor_state("rep", dist.get_world_size(), None), "meta": {"note": "hello", "step": 11}}
    assert ck.save(state, 10).wait().committed
    ck.save(state, 20)  # every write now takes 0.5 s: the test kills us in the middle
    # save() returns before the (low-priority) writer starts: report once it is writing
    assert storage.writing.wait(timeout=600), "the writer never started"
    (root / "results").mkdir(exist_ok=True)
    (root / "results" / f"saving-{dist.get_rank()}").write_text("1")
    for _ in range(600):
        time.sleep(0.1)


def disk_full(root: Path, opts: dict[str, str]) -> None:
    """Saves that do not fit fail with a clear error; training (a step counter here) goes on."""
    ck = Checkpointer(tiers(root, opts), retention=RetentionPolicy(keep_last=5))
    state = {"tensors": dtensor_state("rep", dist.get_world_size(), None)}
    first = ck.save(state, 1).wait()
    huge = {"tensors": state, "ballast": torch.randn(int(opts["ballast"]))}
    second = ck.save(huge, 2).wait()
    steps_after = 0
    for _ in range(3):
        dist.all_reduce(torch.ones(1))
        steps_after += 1
    write_result(
        root,
        {
            "first": first.model_dump(),
            "second": second.model_dump(),
            "steps_after": steps_after,
            "catalog": [c.step for c in ck.catalog()],
        },
    )


SCENARIOS = {f.__name__: f for f in (reshard_save, reshard_load, roundtrip, megatron, slow_save, disk_full)}

if __name__ == "__main__":
    name, root = sys.argv[1], Path(sys.argv[2])
    options = dict(a.split("=", 1) for a in sys.argv[3:])
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 or os.environ.get("MASTER_PORT"):
        dist.init_process_group("gloo")
    SCENARIOS[name](root, options)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
