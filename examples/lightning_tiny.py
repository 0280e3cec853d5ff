"""A tiny GPT pretrained with PyTorch Lightning, protected by Stalwart with a few lines.

The lines marked `# Stalwart` are all the integration asks of a Lightning script: the data comes
from Stalwart's deterministic loader (its position rides in every checkpoint), the callback reports
each step to the node agent and checkpoints through Stalwart's engine, and the Trainer is placed as
torchrun (or Stalwart's agent) launched it. `--without-stalwart` trains the same model on the same
data with the callback left out (the overhead measurement's baseline).

    stalwart data build examples/data/shards examples/data/stories.txt examples/data/logs.txt
    torchrun --nproc-per-node 2 examples/lightning_tiny.py --steps 50
    stalwart run examples/lightning-tiny.yaml
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from pretrain_tiny import TinyGPT  # the same model as the project's DDP example (this script's folder)

from stalwart.agents.worker_sdk import SampleLog
from stalwart.dataloader import DataConfig, SourceSpec
from stalwart.integrations.lightning import StalwartCallback, StalwartData, trainer_kwargs  # Stalwart


class TinyGPTModule(L.LightningModule):
    def __init__(self, seq: int, lr: float, step_delay: float, sample_log: str | None) -> None:
        super().__init__()
        self.model = TinyGPT(seq=seq)
        self.lr, self.step_delay = lr, step_delay
        self.sample_log = sample_log
        self.samples: SampleLog | None = None
        # When each step of this run ended: wall, the process's CPU (every thread) and this thread's CPU.
        self.step_ends: list[tuple[float, float, float]] = []

    def on_fit_start(self) -> None:
        self.samples = SampleLog(self.sample_log)  # an audit: each step's sample ids, per rank

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        data = batch["tokens"]
        logits = self.model(data[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), data[:, 1:].reshape(-1))

    def on_train_batch_end(self, outputs: Any, batch: dict[str, Any], batch_idx: int) -> None:
        if self.step_delay:
            time.sleep(self.step_delay)
        if self.samples is not None:
            self.samples.write(self.trainer.global_step, batch["sample_ids"].tolist())
        self.step_ends.append((time.perf_counter(), time.process_time(), time.thread_time()))

    def on_fit_end(self) -> None:
        if self.samples is not None:
            self.samples.close()

    def configure_optimizers(self) -> Any:
        optim = torch.optim.AdamW(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda step: min(1.0, (step + 1) / 10))  # warm-up
        return {"optimizer": optim, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (demos)")
    parser.add_argument(
        "--shards",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shards", "*.stok"),
        help="token shards when not run by Stalwart",
    )
    parser.add_argument("--sample-log", default=None, help="record each step's sample ids here (an audit)")
    parser.add_argument("--without-stalwart", action="store_true", help="the same training, no Stalwart callback")
    parser.add_argument("--checkpoints", default="checkpoints/lightning-tiny", help="where, outside Stalwart")
    parser.add_argument(
        "--lightning-checkpoints",
        type=int,
        default=0,
        help="with --without-stalwart: Lightning's own ModelCheckpoint every N steps (the benchmark's anchor)",
    )
    args = parser.parse_args()

    L.seed_everything(args.seed, verbose=False)
    # Stalwart: the job spec's data section replaces this default under Stalwart.
    config = DataConfig(sources=[SourceSpec(name="text", shards=[args.shards])], seq_len=args.seq, seed=args.seed)
    data = StalwartData(config, micro_batch=args.batch)  # Stalwart
    callbacks: list[L.Callback] = (
        [] if args.without_stalwart else [StalwartCallback(data, checkpoint_uri=args.checkpoints)]  # Stalwart
    )
    if args.without_stalwart and args.lightning_checkpoints:
        callbacks.append(ModelCheckpoint(dirpath=args.checkpoints, every_n_train_steps=args.lightning_checkpoints))
    trainer = L.Trainer(
        max_steps=args.steps,
        callbacks=callbacks,
        use_distributed_sampler=False,  # the data is already this rank's share
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),  # Stalwart checkpoints
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **trainer_kwargs(),  # Stalwart: DDP over the processes torchrun (or the agent) started
    )
    module = TinyGPTModule(data.config.seq_len, args.lr, args.step_delay, args.sample_log)
    trainer.fit(module, train_dataloaders=data.dataloader())
    if trainer.global_rank == 0:
        resumed = next((c.resumed_from for c in callbacks if isinstance(c, StalwartCallback)), 0)
        walls, cpus, threads = (
            [b[i] - a[i] for a, b in zip(module.step_ends, module.step_ends[1:], strict=False)] for i in range(3)
        )
        steps = sorted(walls[1:])  # the first step left out: it pays for the first collectives
        median = steps[len(steps) // 2] * 1000 if steps else float("nan")
        mean = sum(steps) / len(steps) * 1000 if steps else float("nan")  # checkpoint steps included
        hooks = data.clock.per_step() if not args.without_stalwart else None  # the integration's own time
        report = {"step_times": walls, "cpu_times": cpus, "thread_times": threads, "hooks": hooks}
        print("STEP_TIMES " + json.dumps({"stalwart": not args.without_stalwart, **report}), flush=True)
        print(
            f"world={trainer.world_size} resumed_from={resumed} steps={trainer.global_step} "
            f"median_step_time {median:.1f}ms mean_step_time {mean:.1f}ms",
            flush=True,
        )
    data.close()


if __name__ == "__main__":
    main()
