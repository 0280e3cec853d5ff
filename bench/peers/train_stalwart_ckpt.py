"""Stalwart's checkpoint engine in the same loop as the peers' scripts, for the blocked-time column:
`Checkpointer.save` returns once the state is staged (copied), the write goes on behind, one save in
flight at a time, as the example's PeriodicCheckpoints does. Run under torchrun from Stalwart's venv;
the tier is a folder in /dev/shm (host memory, like DLRover's flash checkpoint)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from stalwart.checkpoint import Checkpointer, TrainState, open_storage

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Audit, TinyGPT, batch_for, loss_of, parse_args, sample_ids


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(TinyGPT())
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ckpt = Checkpointer([open_storage(str(args.ckpt_dir))])
    state = {"train": TrainState(model, optim)}
    audit = Audit(args.out, rank)
    pending = None
    for step in range(1, args.steps + 1):
        ids = sample_ids(step, rank, world)
        loss = loss_of(model, batch_for(ids))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        value = loss.detach()
        dist.all_reduce(value)
        time.sleep(args.step_delay)
        audit.step(step, ids)
        if step % args.interval == 0:
            t0 = time.perf_counter()
            if pending is not None:
                pending.wait()  # one save in flight
            pending = ckpt.save(state, step)  # returns once staged
            audit.checkpoint(step, time.perf_counter() - t0)
    if pending is not None:
        pending.wait()
    ckpt.close()
    audit.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
