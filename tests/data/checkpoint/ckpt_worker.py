"""Checkpoint scenarios run by real ranks (torchrun-style env), driven by tests/test_checkpoint_*.py.

    python ckpt_worker.py SCENARIO ROOT [KEY=VALUE ...]

Each scenario writes rank-R.json with its findings into ROOT/results/ for the test to read.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from stalwart.checkpoint import Checkpointer, GlobalShard, RetentionPolicy, open_storage
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

    def open_writer(self, path: str):  # type: ignore[no-untyped-def]
        inner = super().open_writer(path)
        if not path.startswith("step-0000000020/"):
            return inner  # only the save the test kills is slow
        original = inner.write

        def slow_write(data):  # type: ignore[no-untyped-def]
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


def roundtrip(root: Path, opts: dict[str, str]) -> None:
    kind = opts["kind"]
    ck = Checkpointer(tiers(root, opts))
    model, optim = wrapped(kind, seed=1)
    before = flat_full(TrainState(model, optim).state_dict())
    ck.save({"train": TrainState(model, optim)}, 1).wait()
    model2, optim2 = wrapped(kind, seed=99)  # different weights and optimizer moments
    differs = any(not torch.equal(v, flat_full(TrainState(model2, optim2).state_dict())[k]) for k, v in before.items())
    ck.load({"train": TrainState(model2, optim2)})
    after = flat_full(TrainState(model2, optim2).state_dict())
    equal = {k: bool(torch.equal(v, after[k])) for k, v in before.items()}
    write_result(root, {"equal": equal, "differed_before_load": differs, "n": len(before)})


def megatron(root: Path, opts: dict[str, str]) -> None:
    """Megatron-core ShardedTensors (row-sharded, with replicas) saved by N ranks, loaded by M."""
    from megatron.core.dist_checkpointing import ShardedTensor

    rank, world = dist.get_rank(), dist.get_world_size()
    ref = reference()["w1"]  # (64, 48)
    tp = int(opts.get("tp", str(world)))  # shard rows over tp ranks; the other ranks are replicas
    tp_rank, dp_rank = rank % tp, rank // tp
    rows = ref.shape[0] // tp
    local = (ref if opts["mode"] == "save" else torch.zeros_like(ref))[tp_rank * rows : (tp_rank + 1) * rows].clone()
    st = ShardedTensor.from_rank_offsets("decoder.w1", local, (0, tp_rank, tp), replica_id=dp_rank)
    shard = GlobalShard(st.data, st.global_shape, st.global_offset)
    ck = Checkpointer(tiers(root, opts))
    if opts["mode"] == "save":
        res = ck.save({"model": {st.key: shard}}, 3).wait()
        write_result(root, res.model_dump())
    else:
        ck.load({"model": {st.key: shard}})
        expect = ref[tp_rank * rows : (tp_rank + 1) * rows]
        write_result(root, {"equal": {"w1": bool(torch.equal(local, expect))}})


def slow_save(root: Path, opts: dict[str, str]) -> None:
    """Save step 10 and commit it; then start saving step 20 and report, to be killed mid-save."""
    ck = Checkpointer([SlowFileStorage(root / "ckpt")])
    state = {"tensors": dtensor_state("rep", dist.get_world_size(), None), "meta": {"note": "hello", "step": 11}}
    assert ck.save(state, 10).wait().committed
    ck.save(state, 20)  # every write now takes 0.5 s: the test kills us in the middle
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
