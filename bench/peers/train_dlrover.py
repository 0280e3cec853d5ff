"""DLRover's recommended loop: `dlrover-run` (its elastic agent restarts the workers in place and
keeps the shared memory) with Flash Checkpoint: the state is copied to the node's shared memory every
`--interval` steps (the agent persists it to disk in the background) and to disk every
`--disk-every` memory saves; a restart loads the newest from memory when the node survived.

A hang: the process group's timeout (`--collective-timeout`) fails the partners' collective and
the agent restarts the workers; the master's own hang detector reads GPU (xpu_timer) metrics and
waits at least 2 minutes (`--hang_downtime`, in minutes), so on CPU the collective timeout is it."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from dlrover.trainer.torch.flash_checkpoint.ddp import DdpCheckpointer, StorageType
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Audit, TinyGPT, batch_for, loss_of, parse_args, sample_ids

DISK_EVERY = 5  # a disk copy every 5th memory save, as DLRover's examples do


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.collective_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(TinyGPT())
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    checkpointer = DdpCheckpointer(str(args.ckpt_dir))
    state = checkpointer.load_checkpoint()
    start = 0
    if state and "model" in state:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = int(state["step"])
    audit = Audit(args.out, rank)
    for step in range(start + 1, args.steps + 1):
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
            state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step}
            kind = StorageType.DISK if step % (args.interval * DISK_EVERY) == 0 else StorageType.MEMORY
            checkpointer.save_checkpoint(step, state, storage_type=kind)
            audit.checkpoint(step, time.perf_counter() - t0)
    audit.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
