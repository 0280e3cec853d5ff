"""A stand-in trainer for the data-loader tests: real processes, real gloo, real checkpoints.

Each step takes this rank's batch, all-reduces something computed from it (the DDP pattern) and
all-gathers the sample ids, which rank 0 journals. Every --ckpt-every steps rank 0 writes a checkpoint
(step, loader state, the ids of the steps since the last checkpoint) atomically; a restart resumes from
the newest one, as a real trainer resumes from its last committed checkpoint.

--pause-at S: after step S (the first time any incarnation gets there), write paused-S-rankR and wait
for go-S (or to be killed). Tests use it to fail or disturb the run at an exact, chosen point.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from stalwart.dataloader import DataConfig, DeterministicLoader, ShadowLoaderClient


def latest_checkpoint(root: Path) -> dict | None:
    ckpts = sorted(root.glob("ckpt-*.json"))
    return json.loads(ckpts[-1].read_text()) if ckpts else None


def write_atomic(path: Path, payload: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def join_group() -> None:
    """gloo over torch's env:// rendezvous. Forked by the tests' rank host (support.ranks), as an agent
    forks a worker, rank 0's store already listens (TORCHELASTIC_USE_AGENT_STORE); started cold, rank 0
    serves it itself."""
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--micro-batch", type=int, required=True)
    p.add_argument("--shm", default=None, help="shadow-loader segment; in-process loader without it")
    p.add_argument("--no-fallback", action="store_true", help="shadow client: wait for the loader, never compute")
    p.add_argument("--pause-at", type=int, action="append", default=[])
    args = p.parse_args()

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    join_group()
    config = DataConfig.loads(args.config.read_text())
    if args.shm:
        loader = ShadowLoaderClient(
            args.shm,
            lane=local_rank,
            dp_rank=rank,
            dp_size=world,
            micro_batch=args.micro_batch,
            config=config,
            local_fallback=not args.no_fallback,
            wait_timeout=60.0,
        )
    else:
        loader = DeterministicLoader(config, dp_rank=rank, dp_size=world, micro_batch=args.micro_batch)

    ckpt_dir = args.run_dir / "ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = latest_checkpoint(ckpt_dir)
    start = 0
    if ckpt is not None:
        loader.load_state_dict(ckpt["loader"])
        start = ckpt["step"]
    journal = open(args.run_dir / "journal.jsonl", "a") if rank == 0 else None
    window: dict[int, list[int]] = {}
    for step in range(start + 1, args.steps + 1):
        batch = loader.next_batch()
        assert batch.tokens.shape == (args.micro_batch, config.seq_len + 1) and batch.tokens.dtype == torch.int64
        signal = batch.tokens.float().mean().reshape(1)
        dist.all_reduce(signal)  # the gradient all-reduce stand-in
        gathered = [torch.zeros(args.micro_batch, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(gathered, batch.sample_ids)
        ids = torch.cat(gathered).tolist()
        window[step] = ids
        if journal is not None:
            stats = getattr(loader, "stats", None)
            journal.write(
                json.dumps(
                    {
                        "step": step,
                        "position": batch.position,
                        "ids": ids,
                        "pid": os.getpid(),
                        "served_by": batch.served_by,
                        "adopted": getattr(stats, "adopted", 0),
                    }
                )
                + "\n"
            )
            journal.flush()
        if step % args.ckpt_every == 0 or step == args.steps:
            state = loader.state_dict()
            dist.barrier()
            if rank == 0:
                write_atomic(ckpt_dir / f"ckpt-{step:06d}.json", {"step": step, "loader": state, "window": window})
            dist.barrier()
            window = {}
        if step in args.pause_at and not (args.run_dir / f"paused-{step}-rank{rank}").exists():
            (args.run_dir / f"paused-{step}-rank{rank}").write_text(str(os.getpid()))
            for _ in range(600):  # bounded: 60 s, then carry on
                if (args.run_dir / f"go-{step}").exists():
                    break
                time.sleep(0.1)
    dist.barrier()
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
