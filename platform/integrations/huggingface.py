"""Stalwart for a Hugging Face `transformers` Trainer: swap `Trainer` for `StalwartTrainer`.

    trainer = StalwartTrainer(model=model, args=args, data_config=config)  # instead of Trainer(...)
    trainer.train()

`StalwartTrainer` (or `StalwartTrainerMixin` in front of your own Trainer subclass) does three things:

- feeds the Trainer from Stalwart's deterministic loader (the node's shadow loader under Stalwart),
  one batch per micro-step, so the data position is exact and rides in every checkpoint;
- hands each micro-step's loss to `StalwartCallback` (the Trainer logs only every `logging_steps`);
- adds `StalwartCallback`, which reports every step to the node agent (step, loss, tokens, data /
  compute / optimizer time; a NaN or infinite loss raises FloatingPointError, so the job rolls back),
  saves asynchronously through Stalwart's checkpoint engine every CHECKPOINT_INTERVAL steps to the
  tiers the agent gives, and at the start loads the newest checkpoint a rollback allows: model,
  optimizer, LR scheduler, RNG, the Trainer's step counter and the loader's position.

What this costs each step is measured as it runs: `StalwartCallback.clock` (a HookClock) holds the wall
and CPU time the training thread spent in the integration's hooks, the periodic saves and the loader's
own batch fetches left out; it is logged when training ends.

Outside Stalwart the reports are no-ops and checkpoints go to `checkpoint_dir` (none if not given),
so the same script runs under plain torchrun.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import PeriodicCheckpoints, SampleLog, StepTimer, flush, report_load
from stalwart.checkpoint import Checkpointer, NoCheckpoint, RetentionPolicy, RNGState, TrainState
from stalwart.dataloader import DataConfig, open_loader
from stalwart.dataloader.batch import BatchLoader
from stalwart.integrations.common import HookClock, SchedulerState, checkpoint_tiers, data_config_from_env

log = logging.getLogger(__name__)

__all__ = [
    "SchedulerState",
    "StalwartBatches",
    "StalwartCallback",
    "StalwartTrainer",
    "StalwartTrainerMixin",
    "checkpoint_tiers",
    "data_config_from_env",
]


class _NoData:
    """Stands in for a loader when the Trainer is not fed by Stalwart's (no data position to save)."""

    def state_delta(self) -> None:
        return None


class StalwartCallback(TrainerCallback):
    """Progress, step phases, NaN rollbacks and exact checkpoints for a Trainer (see the module's doc).

    `StalwartTrainerMixin` adds it and feeds it the loader and each micro-step's loss; on its own (a
    Trainer of your own making) it reports steps and phases and checkpoints model, optimizer,
    scheduler, RNG and step, but reports no loss and saves no data position.
    """

    def __init__(self, *, checkpoint_dir: str | None = None, sample_log: str | None = None) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.samples = SampleLog(sample_log)
        self.timer = StepTimer()
        self.clock = HookClock()  # the integration's own time on the training thread
        self.loader: BatchLoader | None = None
        self.trainer: Trainer | None = None
        self.resumed_step = 0
        self._losses: list[torch.Tensor] = []
        self._ids: list[int] = []
        self._tokens = 0
        self._mark = 0.0
        self._ckpt: Checkpointer | None = None
        self._periodic: PeriodicCheckpoints | None = None

    # --- fed by the mixin ---------------------------------------------------------------------
    def record_batch(self, sample_ids: list[int], tokens: int) -> None:
        self._ids.extend(sample_ids)
        self._tokens += tokens
        self._mark = time.perf_counter()  # the step's compute starts after its last batch

    def record_loss(self, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach())

    # --- Trainer events ------------------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        tiers = checkpoint_tiers(self.checkpoint_dir)
        if not tiers:
            return
        model, optimizer, scheduler = kwargs["model"], kwargs["optimizer"], kwargs.get("lr_scheduler")
        keep = contract.int_var(contract.CHECKPOINT_KEEP) or 3
        self._ckpt = Checkpointer(tiers, retention=RetentionPolicy(keep_last=keep))
        ckpt_state: dict[str, Any] = {
            "train": TrainState(model, getattr(optimizer, "optimizer", optimizer)),  # AcceleratedOptimizer's own
            "rng": RNGState(),
        }
        if scheduler is not None:
            ckpt_state["schedule"] = SchedulerState(scheduler)
        if self.loader is not None:
            ckpt_state["data"] = self.loader
        started = time.perf_counter()
        try:
            start = self._ckpt.load(ckpt_state, fallback=True)  # the newest, or the newest a rollback allows
        except NoCheckpoint:
            start = 0
        if start:
            report_load(start, time.perf_counter() - started, self._ckpt.last_load_tier)
            state.global_step = start  # the Trainer counts on from the checkpoint's step
            if self.trainer is not None:  # its loss logging averages over the steps since this one
                self.trainer._globalstep_last_logged = start
            log.info("resumed from step %d (tier %s)", start, self._ckpt.last_load_tier)
        self.resumed_step = start
        interval = contract.int_var(contract.CHECKPOINT_INTERVAL) or 10
        loader: Any = self.loader if self.loader is not None else _NoData()
        self._periodic = PeriodicCheckpoints(self._ckpt, ckpt_state, loader, interval, last_step=state.max_steps)
        self.timer = StepTimer()  # the first step's time starts now, not at construction

    # Three clocked hooks a step (and one per micro-batch, in StalwartBatches): the phases are marked
    # where a hook runs anyway, since the clock's own reads cost as much as a mark. The step's compute
    # starts when its last batch is fetched (the Trainer fetches a step's batches before on_step_begin).
    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self.loader is None:  # not fed by StalwartBatches, which marks the step's start itself
            with self.clock:
                self._mark = time.perf_counter()

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        with self.clock:
            now = time.perf_counter()
            self.timer.times["compute"] = now - self._mark  # forward, backward (DDP's all-reduce) and clipping
            self._mark = now

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        step = state.global_step
        with self.clock:
            self.timer.times["optimizer"] = time.perf_counter() - self._mark  # its step, the LR's, zero_grad
            # The Trainer already waited for this loss (its NaN filter reads it), so reading it syncs nothing.
            loss = _mean_loss(self._losses)
            # A NaN or infinite loss raises FloatingPointError here (the worker SDK's check): the job rolls back.
            self.timer.report(step, loss=loss, tokens=self._tokens or None)
            self.samples.write(step, self._ids)
            self._losses, self._ids, self._tokens = [], [], 0
            self.clock.step_done()
        if self._periodic is not None:
            self._periodic.after_step(step)  # every CHECKPOINT_INTERVAL steps, written while training goes on

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any) -> None:
        if self._periodic is not None:
            self._periodic.finish()
        flush()  # the last reports go out now, not at the sender's next round
        if self._ckpt is not None:
            self._ckpt.close()
        self.clock.log_cost(log)
        if self.loader is not None:
            self.loader.close()
            self.loader = None
        self.samples.close()


def _mean_loss(losses: list[torch.Tensor]) -> float | None:
    """The step's loss: its micro-steps' mean (one micro-step: read as it is, no stack)."""
    if not losses:
        return None
    if len(losses) == 1 and losses[0].numel() == 1:
        return float(losses[0])
    return float(torch.stack(losses).float().mean())


class StalwartBatches:
    """What the Trainer iterates: this rank's batches from Stalwart's loader, one per micro-step, as
    `{"input_ids": tokens, "labels": tokens}` (seq_len + 1 tokens; causal LMs shift labels themselves).
    Nothing is prefetched, so the loader's position is exactly what the Trainer has consumed."""

    def __init__(self, loader: BatchLoader, callback: StalwartCallback) -> None:
        self.loader, self.callback = loader, callback

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            with self.callback.timer.phase("data"):
                batch = self.loader.next_batch()
            with self.callback.clock:
                tokens = batch.tokens
                ids = batch.sample_ids.tolist() if self.callback.samples.enabled else []  # (for the audit only)
                self.callback.record_batch(ids, int(tokens.shape[0] * (tokens.shape[1] - 1)))
            yield {"input_ids": tokens, "labels": tokens}


class StalwartTrainerMixin:
    """Put in front of a Trainer class: `class MyTrainer(StalwartTrainerMixin, Trainer)`. Takes
    `data_config` (the loader's; the job spec's replaces it under Stalwart), and optionally
    `checkpoint_dir` (outside Stalwart) and `sample_log` (a folder for the per-step sample audit)."""

    def __init__(
        self,
        *args: Any,
        data_config: DataConfig,
        checkpoint_dir: str | None = None,
        sample_log: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.stalwart = StalwartCallback(checkpoint_dir=checkpoint_dir, sample_log=sample_log)
        self.stalwart.trainer = self  # type: ignore[assignment]
        self.stalwart_data_config = data_config_from_env(data_config)
        self.add_callback(self.stalwart)  # type: ignore[attr-defined]

    def get_train_dataloader(self) -> Any:
        if self.stalwart.loader is None:
            trainer_args: TrainingArguments = self.args  # type: ignore[attr-defined]
            if trainer_args.max_steps <= 0:
                raise ValueError("StalwartTrainer needs TrainingArguments.max_steps > 0: its data stream has no end")
            micro_batch = contract.int_var(contract.DATA_MICRO_BATCH) or trainer_args.per_device_train_batch_size
            self.stalwart.loader = open_loader(
                self.stalwart_data_config,
                dp_rank=trainer_args.process_index,
                dp_size=trainer_args.world_size,
                micro_batch=micro_batch,
            )
        return StalwartBatches(self.stalwart.loader, self.stalwart)

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss: torch.Tensor = super().training_step(*args, **kwargs)  # type: ignore[misc]
        with self.stalwart.clock:
            self.stalwart.record_loss(loss)
        return loss


class StalwartTrainer(StalwartTrainerMixin, Trainer):
    """`transformers.Trainer` with Stalwart's data, progress and checkpoints (StalwartTrainerMixin)."""
