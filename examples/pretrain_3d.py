"""A small transformer trained with tensor x pipeline x data parallelism (a torchrun-style script).

The layout comes from the job spec's `parallelism` (under Stalwart, through the worker contract's
STALWART_TP / STALWART_PP; under plain torchrun, from --tp / --pp), data parallelism is what the
world leaves:

- tensor parallelism with DTensor: each block's attention heads and MLP are split over the TP group
  (column-wise in, row-wise out, Megatron style);
- pipeline parallelism with torch.distributed.pipelining: the blocks are cut into PP stages, the
  embedding on the first, the head and the loss on the last, micro-batches run by GPipe;
- data parallelism: each DP replica reads its own share of the global batch from the deterministic
  loader, and gradients are averaged over the DP group.

Ranks follow Megatron's order (tensor fastest, pipeline slowest): rank = tp + TP * (dp + DP * pp),
the device mesh (pp, dp, tp). It checkpoints through stalwart.checkpoint (each stage saves its own
layers; the checkpoint is parallelism-agnostic) and reports where each step's time went.

    torchrun --nproc-per-node 8 examples/pretrain_3d.py --tp 2 --pp 2 --steps 20
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

# Outside Stalwart (no agent socket) the reports are no-ops, so the script also runs under plain torchrun.
from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import PeriodicCheckpoints, StepTimer, layout, report_load
from stalwart.checkpoint import Checkpointer, NoCheckpoint, RetentionPolicy, RNGState, TrainState, open_storage
from stalwart.dataloader import DataConfig, SourceSpec, open_loader


# --------------------------------------------------------------------------------------- model
class Attention(nn.Module):
    """Causal self-attention whose projections the TP plan shards: heads split over the TP group."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1: the heads this rank holds (all of them without TP, heads / TP with it)
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.ln2, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Stage(nn.Module):
    """One pipeline stage of the model. Layers keep their global names (blocks.<i>), so every
    stage's checkpoint keys are the full model's and a checkpoint loads into any PP size."""

    def __init__(self, stage: int, stages: int, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        per = layers // stages
        self.first, self.last = stage == 0, stage == stages - 1
        self.tok = nn.Embedding(vocab, dim) if self.first else None
        self.pos = nn.Embedding(seq, dim) if self.first else None
        self.blocks = nn.ModuleDict({str(i): Block(dim, heads) for i in range(stage * per, (stage + 1) * per)})
        self.ln = nn.LayerNorm(dim) if self.last else None
        self.head = nn.Linear(dim, vocab, bias=False) if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok is not None and self.pos is not None:
            x = self.tok(x) + self.pos(torch.arange(x.size(1), device=x.device))
        for block in self.blocks.values():
            x = block(x)
        if self.ln is not None and self.head is not None:
            x = self.head(self.ln(x))
        return x


def shard_tensor_parallel(stage: Stage, tp_mesh: DeviceMesh) -> None:
    """Megatron's split of each block: q, k, v and up column-wise, out and down row-wise."""
    plan = {
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.out": RowwiseParallel(),
        "up": ColwiseParallel(),
        "down": RowwiseParallel(),
    }
    for block in stage.blocks.values():
        parallelize_module(block, tp_mesh, plan)


def average_gradients(stage: Stage, dp_group: dist.ProcessGroup, dp: int) -> None:
    """Data parallelism: every replica ends the step with the mean gradient (one all-reduce)."""
    grads = [p.grad for p in stage.parameters() if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    flat = torch.cat([g.reshape(-1) for g in local])
    dist.all_reduce(flat, group=dp_group)
    flat /= dp
    offset = 0
    for g in local:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


class StageTrainState(TrainState):
    """A stage's model and optimizer, with the optimizer's param groups keyed by parameter name
    rather than by list position: pipeline stages hold different parameters, and position-keyed
    groups ("param_groups.0.lr") would collide across stages in the checkpoint (torchtitan flattens
    for the same reason)."""

    OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

    def state_dict(self) -> dict[str, Any]:
        assert self.optimizer is not None
        model_sd, optim_sd = get_state_dict(self.model, [self.optimizer], options=self.OPTIONS)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        assert self.optimizer is not None
        set_state_dict(
            self.model,
            [self.optimizer],
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self.OPTIONS,
        )


# ---------------------------------------------------------------------------------------- data
def data_config(shards: str, seq: int, seed: int) -> DataConfig:
    """Under Stalwart the job spec's data section arrives in the environment; otherwise, --shards."""
    if os.environ.get(contract.DATA_CONFIG):
        return DataConfig.model_validate_json(os.environ[contract.DATA_CONFIG])
    return DataConfig(sources=[SourceSpec(name="text", shards=[shards])], seq_len=seq, seed=seed)


# ---------------------------------------------------------------------------------------- train
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tp", type=int, default=None, help="tensor parallel size (default: the job spec's)")
    parser.add_argument("--pp", type=int, default=None, help="pipeline parallel size (default: the job spec's)")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks, split over the stages")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4, help="sequences per DP replica per step")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (demos)")
    parser.add_argument(
        "--shards",
        default=os.path.join(os.path.dirname(__file__), "data", "shards", "*.stok"),
        help="token shards when not run by Stalwart",
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = layout()
    tp, pp = args.tp or sizes.tp, args.pp or sizes.pp
    if world % (tp * pp) or args.layers % pp or args.heads % tp:
        raise SystemExit(f"world {world}, {args.layers} layers, {args.heads} heads do not split into TP {tp} x PP {pp}")
    dp = world // (tp * pp)
    mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank, dp_rank = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    torch.manual_seed(args.seed)  # every rank builds the same full-size layers before TP shards them

    config = data_config(args.shards, args.seq, args.seed)
    micro_batch = int(os.environ.get(contract.DATA_MICRO_BATCH, args.batch))
    loader = open_loader(config, dp_rank=dp_rank, dp_size=dp, micro_batch=micro_batch)
    model = Stage(pp_rank, pp, vocab=257, dim=args.dim, heads=args.heads, layers=args.layers, seq=config.seq_len)
    shard_tensor_parallel(model, mesh["tp"])
    stage = PipelineStage(model, pp_rank, pp, torch.device("cpu"), group=mesh["pp"].get_group())

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=False)

    interval = contract.int_var(contract.CHECKPOINT_INTERVAL) or 10
    keep = contract.int_var(contract.CHECKPOINT_KEEP) or 3
    tiers = [open_storage(os.environ.get(contract.CHECKPOINT_URI, "checkpoints/pretrain-3d"))]
    if os.environ.get(contract.CHECKPOINT_MEMORY_URI):
        tiers.insert(0, open_storage(os.environ[contract.CHECKPOINT_MEMORY_URI]))
    ckpt = Checkpointer(tiers, retention=RetentionPolicy(keep_last=keep))
    state = {"train": StageTrainState(model, optim), "rng": RNGState(), "data": loader}
    loading = time.perf_counter()
    try:
        start = ckpt.load(state, fallback=True)  # the newest, or the newest a rollback allows
    except NoCheckpoint:
        start = 0
    if start:
        report_load(start, time.perf_counter() - loading, ckpt.last_load_tier)  # for the agent's metrics
    if rank == 0:
        print(
            f"world={world} layout: tp {tp} x pp {pp} x dp {dp} resuming_from_step={start} "
            f"tier={ckpt.last_load_tier or '-'} steps={args.steps}",
            flush=True,
        )

    timer = StepTimer()
    checkpoints = PeriodicCheckpoints(ckpt, state, loader, interval, last_step=args.steps)
    world_group = dist.group.WORLD
    for step in range(start + 1, args.steps + 1):
        with timer.phase("data"):
            tokens = loader.next_batch().tokens
        with timer.phase("compute"):  # forward and backward of every micro-batch, with the stages' p2p
            optim.zero_grad(set_to_none=True)
            losses: list[torch.Tensor] = []
            if pp_rank == 0:
                schedule.step(tokens[:, :-1])
            elif pp_rank == pp - 1:
                schedule.step(target=tokens[:, 1:], losses=losses)
            else:
                schedule.step()
        with timer.phase("comm"):
            average_gradients(model, mesh["dp"].get_group(), dp)
        with timer.phase("optimizer"):
            optim.step()
        with timer.phase("comm"):
            # The last stage's loss, averaged over the DP replicas, on every rank (its TP ranks agree).
            loss = torch.stack(losses).mean().detach() if losses else torch.zeros(())
            dist.all_reduce(loss, group=world_group)
            mean_loss = loss.item() / (tp * dp)
        if args.step_delay:
            time.sleep(args.step_delay)
        step_time = timer.report(step, loss=mean_loss, tokens=micro_batch * config.seq_len)  # NaN raises here
        if rank == 0 and (step % 10 == 0 or step == start + 1):
            print(f"step {step} loss {mean_loss:.4f} step_time {step_time * 1000:.0f}ms", flush=True)
        checkpoints.after_step(step)  # every `interval` steps; written while training goes on

    checkpoints.finish()
    ckpt.close()
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
