"""A tiny GPT, pretrained with DDP. A plain torchrun-style script: it reads RANK, WORLD_SIZE, ...

It runs unchanged under `torchrun` or under Stalwart; under Stalwart it also reports progress (and
where each step's time went) to its node agent, reads batches from its node's shadow loader, and
checkpoints where the job spec says. Resuming is exact: the data loader's state (a few counters)
rides in the checkpoint with the model, the optimizer and the RNG, so a resumed run sees exactly the
samples a clean run would have. A NaN loss needs no code here: the worker SDK's report_step raises
it, the controller rolls back, and Checkpointer.load honours the rollback's bound.

    stalwart data build examples/data/shards examples/data/stories.txt examples/data/logs.txt
    torchrun --nproc-per-node 2 examples/pretrain_tiny.py --steps 50
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# Outside Stalwart (no agent socket) these are no-ops, so the script also runs under plain torchrun.
from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import PeriodicCheckpoints, SampleLog, StepTimer, report_load, since_launch
from stalwart.checkpoint import Checkpointer, NoCheckpoint, RetentionPolicy, RNGState, TrainState, open_storage
from stalwart.dataloader import DataConfig, SourceSpec, open_loader


# --------------------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 257, dim: int = 64, layers: int = 2, heads: int = 4, seq: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


# ---------------------------------------------------------------------------------------- data
def data_config(shards: str, seq: int, seed: int) -> DataConfig:
    """Under Stalwart the job spec's data section arrives in the environment; otherwise, --shards."""
    if os.environ.get(contract.DATA_CONFIG):
        return DataConfig.model_validate_json(os.environ[contract.DATA_CONFIG])
    return DataConfig(sources=[SourceSpec(name="text", shards=[shards])], seq_len=seq, seed=seed)


# ---------------------------------------------------------------------------------------- train
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (demos)")
    parser.add_argument(
        "--nan-at-step",
        type=int,
        default=None,
        help="fault demo: the loss turns NaN at this step, unless resuming from a rollback (transient)",
    )
    parser.add_argument(
        "--raise-at-step",
        type=int,
        default=None,
        help="fault demo: a bug in the training code raises at this step, every time",
    )
    parser.add_argument(
        "--shards",
        default=os.path.join(os.path.dirname(__file__), "data", "shards", "*.stok"),
        help="token shards when not run by Stalwart",
    )
    parser.add_argument("--sample-log", default=None, help="record each step's sample ids here (an audit)")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    launch = since_launch()  # under Stalwart: the fork (or spawn) and this script's imports
    t0 = time.perf_counter()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    t_pg = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)

    rolled_back = contract.resume_max_step() is not None  # set while the controller rolls back
    config = data_config(args.shards, args.seq, args.seed)
    micro_batch = contract.int_var(contract.DATA_MICRO_BATCH) or args.batch
    # Passes per step: more than 1 while the job runs below its replicas and keeps its global batch.
    accumulation = contract.int_var(contract.DATA_ACCUMULATION) or 1
    loader = open_loader(config, dp_rank=rank, dp_size=world, micro_batch=micro_batch)
    t_data = time.perf_counter()
    model = DDP(TinyGPT(seq=config.seq_len).to(device), device_ids=[device.index] if use_cuda else None)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    interval = contract.int_var(contract.CHECKPOINT_INTERVAL) or 10
    keep = contract.int_var(contract.CHECKPOINT_KEEP) or 3
    # Under Stalwart: host memory (this node and a peer) first, then storage; a restart reads the
    # fastest tier that holds the checkpoint whole.
    tiers = [open_storage(os.environ.get(contract.CHECKPOINT_URI, "checkpoints/pretrain-tiny"))]
    if os.environ.get(contract.CHECKPOINT_MEMORY_URI):
        tiers.insert(0, open_storage(os.environ[contract.CHECKPOINT_MEMORY_URI]))
    ckpt = Checkpointer(tiers, retention=RetentionPolicy(keep_last=keep))
    state = {"train": TrainState(model, optim), "rng": RNGState(), "data": loader}
    t_model = time.perf_counter()
    try:
        start = ckpt.load(state, fallback=True)  # the newest, or the newest a rollback allows
    except NoCheckpoint:
        start = 0
    t_ckpt = time.perf_counter()
    if start:
        report_load(start, t_ckpt - t_model, ckpt.last_load_tier)  # for the agent's metrics
    checkpoints = PeriodicCheckpoints(ckpt, state, loader, interval, last_step=args.steps)
    if rank == 0:
        print(
            f"world={world} device={device} resuming_from_step={start} tier={ckpt.last_load_tier or '-'} "
            f"steps={args.steps} startup: {f'launch {launch:.2f}s, ' if launch is not None else ''}"
            f"process group {t_pg - t0:.2f}s, data {t_data - t_pg:.2f}s, "
            f"model {t_model - t_data:.2f}s, checkpoint {t_ckpt - t_model:.2f}s",
            flush=True,
        )

    samples = SampleLog(args.sample_log)
    timer = StepTimer()
    for step in range(start + 1, args.steps + 1):
        optim.zero_grad(set_to_none=True)
        step_ids: list[int] = []
        step_loss = torch.zeros((), device=device)
        for accumulated in range(accumulation):
            with timer.phase("data"):
                batch = loader.next_batch()
                data = batch.tokens.to(device)
                step_ids += batch.sample_ids.tolist()
            last = accumulated == accumulation - 1
            # forward and backward (DDP's gradient all-reduce included, on the step's last pass only)
            with timer.phase("compute"), contextlib.nullcontext() if last else model.no_sync():
                logits = model(data[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), data[:, 1:].reshape(-1))
                if step == args.nan_at_step and not rolled_back and rank == world - 1:
                    loss = loss * float("nan")  # a transient numerical fault: gone after the rollback
                if step == args.raise_at_step:
                    raise ValueError(
                        f"shapes do not match in my_custom_layer at step {step} (a bug in the training code)"
                    )
                (loss / accumulation).backward()
                step_loss += loss.detach() / accumulation
        with timer.phase("optimizer"):
            optim.step()
        with timer.phase("comm"):
            loss_value = step_loss
            dist.all_reduce(loss_value, op=dist.ReduceOp.AVG if use_cuda else dist.ReduceOp.SUM)
            mean_loss = loss_value.item() / (1 if use_cuda else world)
        if args.step_delay:
            time.sleep(args.step_delay)
        # A NaN or infinite loss raises here (the worker SDK's check), and the job rolls back.
        step_time = timer.report(step, loss=mean_loss, tokens=micro_batch * accumulation * config.seq_len)
        if rank == 0 and (step % 10 == 0 or step == start + 1):
            print(f"step {step} loss {mean_loss:.4f} step_time {step_time * 1000:.0f}ms", flush=True)
        samples.write(step, step_ids)
        checkpoints.after_step(step)  # every `interval` steps; written while training goes on

    checkpoints.finish()
    samples.close()
    ckpt.close()
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
