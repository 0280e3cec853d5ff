"""A tiny GPT-2 trained with the Hugging Face Trainer, protected by Stalwart (a few lines: see STALWART).

It runs unchanged under `torchrun` or under Stalwart. Under Stalwart the Trainer reads batches from
the node's shadow loader, reports every step to its node agent and checkpoints where the job spec
says; a restarted worker resumes model, optimizer, LR schedule, RNG, step and data position exactly.
Nothing is downloaded: the model is built from a config, with the byte vocabulary (257) of the
`.stok` shards that `stalwart data build` makes.

    stalwart data build examples/data/shards examples/data/stories.txt examples/data/logs.txt
    torchrun --nproc-per-node 2 examples/hf_trainer.py --steps 30
    torchrun --nproc-per-node 2 examples/hf_trainer.py --steps 30 --without-stalwart   # plain Trainer

`--without-stalwart` is the overhead measurement's baseline: a plain Trainer fed the same batches from
the same loader (the node's shadow loader under Stalwart), with no callback, no reports and no
checkpoints. Add `--trainer-data` to have it read the shards through its own DataLoader and sampler
instead, as a script without Stalwart would (the data path's comparison, measured apart).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from stalwart import worker_contract as contract
from stalwart.dataloader import DataConfig, SourceSpec, TokenDataset, open_loader
from stalwart.integrations.huggingface import StalwartTrainer, data_config_from_env


class ShardSamples(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """--without-stalwart --trainer-data: the same shards as a map-style dataset, sampled by the
    Trainer's own sampler."""

    def __init__(self, config: DataConfig, length: int) -> None:
        self.dataset, self.length = TokenDataset(config), length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens, _ = self.dataset.fetch(np.array([index]))
        row = torch.from_numpy(tokens[0].astype(np.int64))
        return {"input_ids": row, "labels": row}


class SameBatchesTrainer(Trainer):
    """--without-stalwart: a plain Trainer fed Stalwart's loader's batches, as StalwartTrainer is fed
    (one batch per micro-step, read in the training process or from the node's shadow loader), so that
    the overhead runs differ only in the integration."""

    def __init__(self, *args: Any, data_config: DataConfig, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.data_config = data_config

    def get_train_dataloader(self) -> Any:
        loader = open_loader(
            self.data_config,
            dp_rank=self.args.process_index,
            dp_size=self.args.world_size,
            micro_batch=contract.int_var(contract.DATA_MICRO_BATCH) or self.args.per_device_train_batch_size,
        )

        def batches() -> Any:
            while True:
                tokens = loader.next_batch().tokens
                yield {"input_ids": tokens, "labels": tokens}

        return batches()


class StepClock(TrainerCallback):
    """The benchmark's measure, the same with and without Stalwart: when each step ended, in wall time,
    in the process's CPU time (every thread: what load from other processes barely moves) and in the
    training thread's CPU time."""

    def __init__(self) -> None:
        self.ends: list[tuple[float, float, float]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append((time.perf_counter(), time.process_time(), time.thread_time()))

    def summary(self, hooks: dict[str, float] | None) -> dict[str, Any]:
        """Per step: wall, process CPU and thread CPU seconds; the integration's own time in its hooks."""
        ends = np.array(self.ends).reshape(-1, 3)
        walls, cpus, threads = np.diff(ends, axis=0).T.tolist() if len(ends) > 1 else ([], [], [])
        return {"step_times": walls, "cpu_times": cpus, "thread_times": threads, "hooks": hooks}


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
    parser.add_argument("--checkpoint-dir", default="checkpoints/hf-trainer", help="checkpoints outside Stalwart")
    parser.add_argument("--sample-log", default=None, help="record each step's sample ids here (an audit)")
    parser.add_argument("--without-stalwart", action="store_true", help="a plain Trainer (overhead baseline)")
    parser.add_argument(
        "--trainer-data",
        action="store_true",
        help="with --without-stalwart: the Trainer's own DataLoader and sampler over the shards, not Stalwart's loader",
    )
    parser.add_argument(
        "--trainer-checkpoints",
        type=int,
        default=0,
        help="with --without-stalwart: the Trainer's own checkpoints every N steps (the benchmark's anchor)",
    )
    args = parser.parse_args()

    default = DataConfig(sources=[SourceSpec(name="text", shards=[args.shards])], seq_len=args.seq, seed=args.seed)
    config = data_config_from_env(default)  # under Stalwart: the job spec's data section
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=257,
            n_positions=config.seq_len + 1,  # a sample is seq_len + 1 tokens; the model shifts the labels
            n_embd=64,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=256,
            eos_token_id=256,
        )
    )
    training_args = TrainingArguments(
        output_dir=args.checkpoint_dir if args.trainer_checkpoints else tempfile.mkdtemp(prefix="hf-trainer-"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=5,
        seed=args.seed,
        use_cpu=not torch.cuda.is_available(),
        ddp_backend="nccl" if torch.cuda.is_available() else "gloo",
        report_to="none",
        # Stalwart saves; the plain Trainer saves itself only when asked (the benchmark's anchor).
        save_strategy="steps" if args.without_stalwart and args.trainer_checkpoints else "no",
        save_steps=args.trainer_checkpoints or 500,
        save_total_limit=2,
        logging_steps=10,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    clock = StepClock()
    callbacks: list[TrainerCallback] = [clock]
    if args.step_delay:
        callbacks.append(Delay(args.step_delay))
    trainer: Trainer
    if args.without_stalwart and args.trainer_data:
        length = args.steps * training_args.world_size * args.batch * 2
        trainer = Trainer(
            model=model, args=training_args, train_dataset=ShardSamples(config, length), callbacks=callbacks
        )
    elif args.without_stalwart:
        trainer = SameBatchesTrainer(model=model, args=training_args, data_config=config, callbacks=callbacks)
    else:
        # STALWART: the only change to a plain Trainer script (data_config replaces train_dataset).
        trainer = StalwartTrainer(
            model=model,
            args=training_args,
            data_config=config,
            checkpoint_dir=args.checkpoint_dir,
            sample_log=args.sample_log,
            callbacks=callbacks,
        )
    trainer.train()
    if training_args.process_index == 0:
        hooks = trainer.stalwart.clock.per_step() if isinstance(trainer, StalwartTrainer) else None
        print("STEP_TIMES " + json.dumps({"stalwart": not args.without_stalwart, **clock.summary(hooks)}), flush=True)


class Delay(TrainerCallback):
    """--step-delay: a slower step, so that faults land mid-run in demos."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


if __name__ == "__main__":
    main()
