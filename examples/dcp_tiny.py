"""A tiny GPT with DDP that checkpoints with plain `torch.distributed.checkpoint` onto Stalwart's tiers.

The training script of someone who already uses DCP: `dcp.async_save` (or `dcp.save`, --sync-save)
and `dcp.load`, with Stalwart's DCPWriter / DCPReader as the storage_writer / storage_reader. Under
Stalwart it saves to the node's memory store (with its peer copy) and the job's storage, resumes
from the newest checkpoint (the fastest tier on a tie, never past a rollback's bound), reads its
batches from Stalwart's loader (whose state rides in the same checkpoint, so a resume is exact) and
reports its steps, saves and loads to its node agent. It also runs under plain torchrun.

    stalwart data build examples/data/shards examples/data/stories.txt examples/data/logs.txt
    torchrun --nproc-per-node 2 examples/dcp_tiny.py --steps 50
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import Future

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from pretrain_tiny import TinyGPT, data_config
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP

from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import SampleLog, StepTimer, report_load, report_save
from stalwart.checkpoint import Checkpointer, DCPReader, DCPWriter, RetentionPolicy, Storage, open_storage
from stalwart.dataloader import open_loader


def tiers() -> list[Storage]:
    """Host memory (this node, copied to a peer) first when the agent gives one, then storage."""
    out = [open_storage(os.environ.get(contract.CHECKPOINT_URI, "checkpoints/dcp-tiny"))]
    if os.environ.get(contract.CHECKPOINT_MEMORY_URI):
        out.insert(0, open_storage(os.environ[contract.CHECKPOINT_MEMORY_URI]))
    return out


def candidates(where: list[Storage]) -> list[tuple[int, Storage]]:
    """Committed steps, newest first (the fastest tier first for a step on several), within a rollback's bound."""
    bound = contract.resume_max_step()
    found = [(c.step, i, t) for i, t in enumerate(where) for c in Checkpointer.list_committed(t) if c.error is None]
    return [(s, t) for s, _, t in sorted(found, key=lambda f: (-f[0], f[1])) if bound is None or s <= bound]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (demos)")
    parser.add_argument("--sync-save", action="store_true", help="dcp.save (blocking) instead of dcp.async_save")
    parser.add_argument(
        "--shards",
        default=os.path.join(os.path.dirname(__file__), "data", "shards", "*.stok"),
        help="token shards when not run by Stalwart",
    )
    parser.add_argument("--sample-log", default=None, help="record each step's sample ids here (an audit)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    save_group = dist.new_group(backend="gloo")  # DCP's advice: async saves talk on a group of their own
    torch.manual_seed(args.seed)
    config = data_config(args.shards, args.seq, args.seed)
    micro_batch = contract.int_var(contract.DATA_MICRO_BATCH) or args.batch
    loader = open_loader(config, dp_rank=rank, dp_size=world, micro_batch=micro_batch)
    model = DDP(TinyGPT(seq=config.seq_len))
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    interval = contract.int_var(contract.CHECKPOINT_INTERVAL) or 10
    retention = RetentionPolicy(keep_last=contract.int_var(contract.CHECKPOINT_KEEP) or 3)
    where = tiers()

    # -- resume: plain dcp.load through DCPReader, the newest committed step first ---------------
    start, loaded_tier, t0 = 0, None, time.perf_counter()
    for step, tier in candidates(where):
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd, "data": loader}
        try:
            dcp.load(state, storage_reader=DCPReader(tier, step))
        except CheckpointException as exc:  # raised on every rank alike: all fall back together
            if rank == 0:
                print(f"checkpoint {step} on {tier.name} unreadable, trying an older one: {exc}", flush=True)
            continue
        set_state_dict(model, optim, model_state_dict=msd, optim_state_dict=osd)
        start, loaded_tier = step, tier.name
        break
    if start:
        report_load(start, time.perf_counter() - t0, loaded_tier)
    if rank == 0:
        print(f"world={world} resuming_from_step={start} tier={loaded_tier or '-'} steps={args.steps}", flush=True)

    pending: tuple[Future[object], DCPWriter, float, dict[str, object]] | None = None

    def report(done: tuple[Future[object], DCPWriter, float, dict[str, object]]) -> None:
        future, writer, stall, data_state = done
        future.result()  # DCP raises here, on every rank, if any rank's write or the commit failed
        report_save(writer.outcome(stall), data_state=data_state)

    samples = SampleLog(args.sample_log)
    timer = StepTimer()
    for step in range(start + 1, args.steps + 1):
        with timer.phase("data"):
            batch = loader.next_batch()
        with timer.phase("compute"):
            logits = model(batch.tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch.tokens[:, 1:].reshape(-1))
            optim.zero_grad(set_to_none=True)
            loss.backward()
        with timer.phase("optimizer"):
            optim.step()
        with timer.phase("comm"):
            loss_value = loss.detach()
            dist.all_reduce(loss_value)
            mean_loss = loss_value.item() / world
        if args.step_delay:
            time.sleep(args.step_delay)
        step_time = timer.report(step, loss=mean_loss, tokens=micro_batch * config.seq_len)
        if rank == 0 and (step % 10 == 0 or step == start + 1):
            print(f"step {step} loss {mean_loss:.4f} step_time {step_time * 1000:.0f}ms", flush=True)
        samples.write(step, batch.sample_ids.tolist())
        if pending is not None and pending[0].done():
            report(pending)
            pending = None
        if step % interval == 0 or step == args.steps:
            if pending is not None:
                report(pending)  # one save in flight at a time
            msd, osd = get_state_dict(model, optim)
            state = {"model": msd, "optim": osd, "data": loader}
            writer = DCPWriter(where, step, retention=retention)
            data_state = loader.state_delta()
            t_save = time.perf_counter()
            if args.sync_save:
                dcp.save(state, storage_writer=writer, process_group=save_group)
                done: Future[object] = Future()
                done.set_result(None)
            else:
                done = dcp.async_save(state, storage_writer=writer, process_group=save_group)  # type: ignore[assignment]
            pending = (done, writer, time.perf_counter() - t_save, data_state)

    if pending is not None:
        report(pending)
    samples.close()
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
