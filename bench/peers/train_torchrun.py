"""TorchElastic's recommended loop: `torchrun` (c10d rendezvous, --max-restarts) restarts every
worker after a failure; each resumes from the newest Distributed Checkpoint (DCP).

The save is `dcp.save`, synchronous, as torch's DCP tutorial's loop does. The process group's
timeout is `--collective-timeout` (torch's only hang detection). The harness starts torchrun with
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the rendezvous store shared (the default since torch
2.5), a restarted worker reads the previous attempt's gloo addresses from it and fails in
`Gloo connectFullMesh ... Connection refused` (pytorch/pytorch#135712)."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Audit, TinyGPT, batch_for, loss_of, parse_args, sample_ids


def newest(ckpt_dir: Path) -> int:
    done = [int(p.name.split("-")[1]) for p in ckpt_dir.glob("step-*") if (p / ".metadata").exists()]
    return max(done, default=0)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.collective_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(TinyGPT())
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = newest(args.ckpt_dir)
    if start:
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=str(args.ckpt_dir / f"step-{start}"))
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
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
            msd, osd = get_state_dict(model, optim)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(args.ckpt_dir / f"step-{step}"))
            audit.checkpoint(step, time.perf_counter() - t0)
    audit.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
