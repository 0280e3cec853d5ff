"""A tiny GPT-2 trained by a hand-written `accelerate` loop, protected by Stalwart (StalwartLoop).

It runs unchanged under `torchrun` (or `accelerate launch`) or under Stalwart; a restarted worker
resumes model, optimizer, LR schedule, RNG, step and data position exactly.

    torchrun --nproc-per-node 2 examples/accelerate_loop.py --steps 30
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from accelerate import Accelerator
from transformers import GPT2Config, GPT2LMHeadModel

from stalwart import worker_contract as contract
from stalwart.dataloader import DataConfig, SourceSpec, open_loader
from stalwart.integrations.accelerate import StalwartLoop
from stalwart.integrations.common import data_config_from_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
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
    parser.add_argument("--checkpoint-dir", default="checkpoints/accelerate-loop", help="checkpoints outside Stalwart")
    parser.add_argument("--sample-log", default=None, help="record each step's sample ids here (an audit)")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    torch.manual_seed(args.seed)
    default = DataConfig(sources=[SourceSpec(name="text", shards=[args.shards])], seq_len=args.seq, seed=args.seed)
    config = data_config_from_env(default)  # under Stalwart: the job spec's data section
    micro_batch = contract.int_var(contract.DATA_MICRO_BATCH) or args.batch
    loader = open_loader(
        config, dp_rank=accelerator.process_index, dp_size=accelerator.num_processes, micro_batch=micro_batch
    )
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=257,
            n_positions=config.seq_len + 1,
            n_embd=64,
            n_layer=2,
            n_head=4,
            bos_token_id=256,
            eos_token_id=256,
        )
    )
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, optim = accelerator.prepare(model, optim)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: min(1.0, (step + 1) / 5))

    # STALWART: the helper, a resume, then step_done after each step (and the phases, if you like).
    loop = StalwartLoop(
        model=model,
        optimizer=optim,
        scheduler=sched,
        loader=loader,
        last_step=args.steps,
        checkpoint_dir=args.checkpoint_dir,
        sample_log=args.sample_log,
    )
    start = loop.resume()
    if accelerator.is_main_process:
        print(f"world={accelerator.num_processes} resuming_from_step={start} steps={args.steps}", flush=True)
    for step in range(start + 1, args.steps + 1):
        with loop.phase("data"):
            batch = loader.next_batch()
            tokens = batch.tokens.to(accelerator.device)
        with loop.phase("compute"):
            loss = model(input_ids=tokens, labels=tokens).loss
            accelerator.backward(loss)
        with loop.phase("optimizer"):
            optim.step()
            sched.step()
            optim.zero_grad(set_to_none=True)
        if args.step_delay:
            time.sleep(args.step_delay)
        loop.step_done(step, loss.item(), batch)  # a NaN loss raises here: the job rolls back
        if accelerator.is_main_process and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    loop.finish()
    loader.close()
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
