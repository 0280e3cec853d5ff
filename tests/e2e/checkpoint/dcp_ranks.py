"""Plain DCP through Stalwart's writer and reader, run by real ranks (torchrun-style env, gloo).

    python dcp_ranks.py SCENARIO ROOT uri=URI [mode=save|async]

`save` writes the reference state (each tensor sharded on dim 0 over the world, plus plain values)
with dcp.save or dcp.async_save; `load` reads it back at this world size with dcp.load. Each rank
writes ROOT/results/rank-R.json with what it found.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from stalwart.checkpoint import DCPReader, DCPWriter

SHAPES = {"w1": (64, 48), "w2": (33, 17), "bias": (100,)}
STEP = 7


def reference() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    return {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}


def state(world: int, fill: bool) -> dict[str, object]:
    mesh = init_device_mesh("cpu", (world,))
    ref = reference()
    tensors = {k: distribute_tensor(v if fill else torch.zeros_like(v), mesh, [Shard(0)]) for k, v in ref.items()}
    scalar = distribute_tensor(torch.tensor(3.5 if fill else 0.0), mesh, [Replicate()])
    return {"model": tensors, "scalar": scalar, "loader": {"position": 41 if fill else 0, "epoch": 2 if fill else 0}}


def main() -> None:
    scenario, root = sys.argv[1], Path(sys.argv[2])
    opts = dict(a.split("=", 1) for a in sys.argv[3:])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, object] = {"rank": rank}
    if scenario == "save":
        writer = DCPWriter(opts["uri"], STEP)
        s = state(world, fill=True)
        if opts.get("mode") == "async":
            group = dist.new_group(backend="gloo")  # DCP's advice: async saves talk on their own group
            dcp.async_save(s, storage_writer=writer, process_group=group).result()  # type: ignore[union-attr]
        else:
            dcp.save(s, storage_writer=writer)
        out["result"] = writer.outcome().model_dump()
    elif scenario == "load":
        s = state(world, fill=False)
        dcp.load(s, storage_reader=DCPReader(opts["uri"], STEP))
        ref = reference()
        model = s["model"]
        assert isinstance(model, dict)
        equal = {k: bool(torch.equal(model[k].full_tensor(), ref[k])) for k in ref}
        scalar = s["scalar"]
        assert isinstance(scalar, DTensor)
        equal["scalar"] = float(scalar.full_tensor()) == 3.5
        out["equal"] = equal
        out["loader"] = s["loader"]
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")
    results = root / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"rank-{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
