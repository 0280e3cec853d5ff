"""A tiny Megatron-core GPTModel trained on CPU (gloo, tensor and pipeline parallel 1, data parallel over
the world), protected by Stalwart. A plain torchrun-style script: it reads RANK, WORLD_SIZE, ...

Megatron-core builds the model (its local layer spec: no Transformer Engine, no Apex, no fused
kernels) and describes its state as a sharded state dict; Stalwart's Megatron adapter
(`stalwart.checkpoint.megatron`) saves that dict to the job's tiers and loads it back. The data
loader's state (a few counters, the same on every rank) rides in the same checkpoint as a plain
value, so a resumed run trains exactly the samples a clean run trains. Progress goes to the node
agent through the worker SDK (StepTimer), as in examples/pretrain_tiny.py; outside Stalwart those
calls are no-ops. Data parallelism is a gradient all-reduce written out here: Megatron's own
DistributedDataParallel allocates its buffers on CUDA.

    torchrun --nproc-per-node 2 examples/megatron_gpt.py --steps 20
    stalwart run examples/megatron-gpt.yaml --inject kill-worker:rank=1,step=15
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map, optim_state_to_sharding_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.tensor_parallel import random as megatron_random
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import GlobalMemoryBuffer

from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import PeriodicCheckpoints, SampleLog, StepTimer, report_load
from stalwart.checkpoint import Checkpointer, NoCheckpoint, RetentionPolicy, SaveHandle, megatron, open_storage
from stalwart.dataloader import DataConfig, SourceSpec, open_loader
from stalwart.dataloader.batch import BatchLoader


class CPUMemoryBuffer(GlobalMemoryBuffer):
    """Megatron's scratch buffer (the attention scores' baddbmm input) in host memory: its own allocates
    on `torch.cuda.current_device()`, the one CUDA-only call a CPU forward of the local spec meets."""

    def get_tensor(
        self, tensor_shape: Any, dtype: torch.dtype, name: str, mem_alloc_context: Any = None
    ) -> torch.Tensor:
        need = 1
        for n in tensor_shape:
            need *= n
        held = self.buffer.get((name, dtype))
        if held is None or held.numel() < need:
            held = self.buffer[(name, dtype)] = torch.empty(need, dtype=dtype, requires_grad=False)
        return held[:need].view(*tensor_shape)


class CPURNGTracker(megatron_random.CudaRNGStatesTracker):
    """Megatron forks a CUDA RNG stream around attention dropout; on CPU there is none to fork (and
    this model has no dropout), so the fork is a no-op."""

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        yield


def build_model(seq: int, vocab: int) -> GPTModel:
    config = TransformerConfig(
        num_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        use_cpu_initialization=True,  # Megatron initialises on CUDA otherwise
        hidden_dropout=0.0,  # no dropout: no RNG state to carry across a restart
        attention_dropout=0.0,
        pipeline_dtype=torch.float32,
    )
    return GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=vocab,
        max_sequence_length=seq,
        position_embedding_type="learned_absolute",
    )


def sharded_state(model: GPTModel, optim: torch.optim.Optimizer, loader: BatchLoader) -> dict[str, Any]:
    """The model's and the optimizer's sharded state dicts (the optimizer's in model space, as Megatron's
    FP32Optimizer builds it), and the loader's position as a plain value: saved once, loaded everywhere."""
    model_sd = model.sharded_state_dict()
    optim_sd = optim.state_dict()
    if optim_sd["state"]:  # Adam's moments exist after the first step
        id_map = get_param_id_to_sharded_param_map(model_sd, list(model.parameters()))
        common_step = optim_sd["state"][0]["step"]
        optim_state_to_sharding_state(optim_sd, id_map, exclude_keys="step")
        optim_sd["state"]["common_step"] = common_step
    return {"model": model_sd, "optimizer": optim_sd, "data": loader.state_dict()}


class MegatronCheckpoints:
    """What PeriodicCheckpoints saves through: a fresh sharded state dict at each save (the loader's
    position changes every step), written by the Megatron adapter without waiting for the write."""

    def __init__(self, ckpt: Checkpointer, model: GPTModel, optim: torch.optim.Optimizer, loader: BatchLoader) -> None:
        self.ckpt, self.model, self.optim, self.loader = ckpt, model, optim, loader

    def save(self, state: Any, step: int) -> SaveHandle:
        return megatron.save(self.ckpt, sharded_state(self.model, self.optim, self.loader), step)

    def load(self) -> int:
        """The newest checkpoint (or the newest a rollback allows) into the model, the optimizer and
        the loader; 0 when there is none."""
        if not self.optim.state_dict()["state"]:
            # Adam's moments are made by its first step: make them (zeros) so the dict names them.
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
            lr = [g["lr"] for g in self.optim.param_groups]
            for g in self.optim.param_groups:
                g["lr"] = 0.0
            self.optim.step()
            for g, value in zip(self.optim.param_groups, lr, strict=True):
                g["lr"] = value
            self.optim.zero_grad(set_to_none=True)
        template = sharded_state(self.model, self.optim, self.loader)
        try:
            step, loaded = megatron.load(self.ckpt, template, fallback=True)
        except NoCheckpoint:
            self.optim.state.clear()  # a fresh start: Adam's first real step makes its moments
            return 0
        self.model.load_state_dict(loaded["model"])
        self.optim.load_state_dict(_optimizer_state(self.optim, loaded["optimizer"]))
        self.loader.load_state_dict(loaded["data"])
        return step


def _optimizer_state(optim: torch.optim.Optimizer, loaded: dict[str, Any]) -> dict[str, Any]:
    """Back from model space to torch's layout: the loaded tensors are the optimizer's own, filled in
    place, so only the step counter (saved once as common_step) needs putting back."""
    sd = optim.state_dict()
    step = loaded["state"]["common_step"]
    for state in sd["state"].values():
        state["step"] = torch.as_tensor(step, dtype=torch.float32).clone()
    return sd


def data_config(shards: str, seq: int, seed: int) -> DataConfig:
    """Under Stalwart the job spec's data section arrives in the environment; otherwise, --shards."""
    if os.environ.get(contract.DATA_CONFIG):
        return DataConfig.model_validate_json(os.environ[contract.DATA_CONFIG])
    return DataConfig(sources=[SourceSpec(name="text", shards=[shards])], seq_len=seq, seed=seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (demos)")
    parser.add_argument(
        "--shards",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shards", "*.stok"),
        help="token shards when not run by Stalwart",
    )
    parser.add_argument("--sample-log", default=None, help="record each step's sample ids here (an audit)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    if not torch.cuda.is_available():
        parallel_state._GLOBAL_MEMORY_BUFFER = CPUMemoryBuffer()  # see CPUMemoryBuffer
        megatron_random._CUDA_RNG_STATE_TRACKER = CPURNGTracker()  # see CPURNGTracker
        megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    torch.manual_seed(args.seed)  # the same initial weights on every data-parallel rank

    config = data_config(args.shards, args.seq, args.seed)
    micro_batch = contract.int_var(contract.DATA_MICRO_BATCH) or args.batch
    loader = open_loader(config, dp_rank=rank, dp_size=world, micro_batch=micro_batch)
    model = build_model(config.seq_len, vocab=257)  # the byte-level shards' vocabulary
    optim = torch.optim.Adam(model.parameters(), lr=args.lr)

    tiers = [open_storage(os.environ.get(contract.CHECKPOINT_URI, "checkpoints/megatron-gpt"))]
    if os.environ.get(contract.CHECKPOINT_MEMORY_URI):
        tiers.insert(0, open_storage(os.environ[contract.CHECKPOINT_MEMORY_URI]))
    keep = contract.int_var(contract.CHECKPOINT_KEEP) or 3
    ckpt = Checkpointer(tiers, retention=RetentionPolicy(keep_last=keep))
    saver = MegatronCheckpoints(ckpt, model, optim, loader)
    t0 = time.perf_counter()
    start = saver.load()
    if start:
        report_load(start, time.perf_counter() - t0, ckpt.last_load_tier)
    interval = contract.int_var(contract.CHECKPOINT_INTERVAL) or 10
    checkpoints = PeriodicCheckpoints(saver, None, loader, interval, last_step=args.steps)
    if rank == 0:
        print(f"world={world} resuming_from_step={start} tier={ckpt.last_load_tier or '-'}", flush=True)

    seq = config.seq_len
    position_ids = torch.arange(seq).unsqueeze(0).expand(micro_batch, seq)
    causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1).view(1, 1, seq, seq)  # True: masked
    samples = SampleLog(args.sample_log)
    timer = StepTimer()
    for step in range(start + 1, args.steps + 1):
        with timer.phase("data"):
            batch = loader.next_batch()
            tokens = batch.tokens
        with timer.phase("compute"):
            per_token = model(tokens[:, :-1], position_ids, causal, labels=tokens[:, 1:])  # [b, s] losses
            loss = per_token.float().mean()
            optim.zero_grad(set_to_none=True)
            loss.backward()
        with timer.phase("comm"):  # data parallel: average the gradients, then the loss for the report
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad.div_(world)
            loss_value = loss.detach().clone()
            dist.all_reduce(loss_value, op=dist.ReduceOp.SUM)
            mean_loss = loss_value.item() / world
        with timer.phase("optimizer"):
            optim.step()
        if args.step_delay:
            time.sleep(args.step_delay)
        step_time = timer.report(step, loss=mean_loss, tokens=micro_batch * seq)  # NaN/inf raises: a rollback
        if rank == 0 and (step % 10 == 0 or step == start + 1):
            print(f"step {step} loss {mean_loss:.4f} step_time {step_time * 1000:.0f}ms", flush=True)
        samples.write(step, batch.sample_ids.tolist())
        checkpoints.after_step(step)

    checkpoints.finish()
    samples.close()
    ckpt.close()
    loader.close()
    dist.barrier()
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
