"""Stalwart for PyTorch Lightning: a callback, a data source and the Trainer's arguments.

    from stalwart.integrations.lightning import StalwartCallback, StalwartData, trainer_kwargs

    data = StalwartData(DataConfig(...), micro_batch=8)          # the job spec's data section wins
    trainer = L.Trainer(max_steps=300, callbacks=[StalwartCallback(data)], **trainer_kwargs())
    trainer.fit(model, train_dataloaders=data.dataloader())

The callback does what the project's own examples do: it reports every optimizer step to the node
agent (loss, tokens, where the time went), so a NaN or infinite loss raises the worker SDK's
FloatingPointError and the controller rolls back; it checkpoints through Stalwart's engine to the
tiers the agent names (host memory, then storage) every CHECKPOINT_INTERVAL steps without waiting
for the write; and at the start it loads the newest checkpoint a rollback allows. A checkpoint holds
the model, the optimizers, the LR schedulers, the RNG, Lightning's loop counters and the data
position, so a restarted worker trains exactly the samples a clean run would have.

Why not Lightning's own checkpointing: a Lightning checkpoint is one dictionary written synchronously
by one rank's CheckpointIO, and a resumed sampler is replayed from the epoch's start. Stalwart's
engine writes every rank's shard asynchronously to several tiers, and the data position is a few
counters of Stalwart's deterministic loader, restored before the first batch is drawn.

What the integration costs each step is measured as it runs: `StalwartData.clock` (a HookClock the
callback shares) holds the wall and CPU time the training thread spent in the callback's hooks and the
data's position bookkeeping, the periodic saves and the loader's own batch fetches left out; the
callback logs it when training ends.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, IterableDataset

from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import PeriodicCheckpoints, flush, report_load, report_step
from stalwart.checkpoint import Checkpointer, NoCheckpoint, RetentionPolicy, RNGState, TrainState
from stalwart.dataloader import DataConfig, open_loader
from stalwart.dataloader.batch import BatchLoader
from stalwart.dataloader.dataset import TokenDataset
from stalwart.dataloader.state import LoaderState, delta_at, state_at
from stalwart.integrations.common import HookClock, checkpoint_tiers, data_config_from_env

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 10
DEFAULT_KEEP = 3
_UNUSED_STEP_HOOKS = ("on_before_backward", "on_after_backward", "on_before_zero_grad")


def under_stalwart(environ: Mapping[str, str] | None = None) -> bool:
    """True when a node agent started this process (it names the progress socket)."""
    env = os.environ if environ is None else environ
    return bool(env.get(contract.PROGRESS_SOCKET))


def trainer_kwargs(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Trainer's placement for a process torchrun (or Stalwart's agent, which sets the same
    environment) started: DDP over every process, one device per process. Lightning then detects the
    TorchElastic environment and spawns nothing itself. A process nobody launched trains alone."""
    env = os.environ if environ is None else environ
    accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    world = int(env.get(contract.WORLD_SIZE, "1"))
    if world <= 1 or contract.RUN_ID not in env:
        return {"accelerator": accelerator, "devices": 1, "num_nodes": 1}
    per_node = int(env.get(contract.LOCAL_WORLD_SIZE, str(world)))
    if per_node <= 0 or world % per_node:
        raise ValueError(
            f"{contract.WORLD_SIZE}={world} is not a multiple of {contract.LOCAL_WORLD_SIZE}={per_node}: "
            "every node must run the same number of processes"
        )
    return {"accelerator": accelerator, "strategy": "ddp", "devices": per_node, "num_nodes": world // per_node}


def _dp_placement() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get(contract.RANK, "0")), int(os.environ.get(contract.WORLD_SIZE, "1"))


class StalwartData(IterableDataset[dict[str, Any]]):
    """This rank's batches from Stalwart's deterministic loader, endlessly: each item is one
    micro-batch, {"tokens": int64 [micro_batch, seq_len + 1], "sample_ids": int64 [micro_batch]}.

    Lightning draws a batch ahead of the one it trains, so the loader's own position is one batch
    past the trained data; the position a checkpoint holds is the one after the last batch trained
    (`mark_trained`), which is what `state_dict` returns. It has no `state_dict` Lightning would see:
    the position rides in Stalwart's checkpoint, not Lightning's. A step only notes that position (an
    int); the state at it is built when a checkpoint asks (a loader's state is its position's).
    """

    def __init__(self, config: DataConfig, micro_batch: int) -> None:
        super().__init__()
        self.config = data_config_from_env(config)
        self.micro_batch = contract.int_var(contract.DATA_MICRO_BATCH) or micro_batch
        self.loader: BatchLoader | None = None
        self.clock = HookClock()  # the integration's own time on the training thread (the callback's too)
        self._trained: int | None = None  # the position after the last batch trained

    @property
    def tokens_per_batch(self) -> int:
        return self.micro_batch * self.config.seq_len

    def open(self, dp_rank: int | None = None, dp_size: int | None = None) -> BatchLoader:
        """The loader for this data-parallel rank (by default the process group's placement)."""
        if self.loader is None:
            rank, world = _dp_placement()
            self.loader = open_loader(
                self.config,
                dp_rank=rank if dp_rank is None else dp_rank,
                dp_size=world if dp_size is None else dp_size,
                micro_batch=self.micro_batch,
            )
            self._trained = self.loader.state_dict()["position"]
        return self.loader

    def dataloader(self) -> DataLoader[dict[str, Any]]:
        """A DataLoader over this dataset: already batched, read in the training process (the loader
        computes a batch from a few counters, or reads it from the node's shadow loader)."""
        return DataLoader(self, batch_size=None, num_workers=0)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        loader = self.open()
        while True:
            batch = loader.next_batch()
            yield {"tokens": batch.tokens, "sample_ids": batch.sample_ids, "next_position": batch.next_position}

    def mark_trained(self, batch: Mapping[str, Any]) -> None:
        """The step trained this batch: a checkpoint from now on resumes after it (the callback calls
        it inside its own clocked hook)."""
        self._trained = int(batch["next_position"])

    def state_dict(self) -> dict[str, Any]:
        """The loader's state after the last batch trained (the loader itself is a batch ahead)."""
        if self._trained is None or self.loader is None:
            raise RuntimeError("StalwartData.state_dict before the loader was opened")
        return _state_at(self.loader, self._trained).model_dump()

    def state_delta(self) -> dict[str, Any]:
        if self._trained is None or self.loader is None:
            raise RuntimeError("StalwartData.state_delta before the loader was opened")
        self.loader.state_delta()  # (a shadow loader's client tells its loader where a restart would resume)
        return delta_at(_dataset(self.loader), self._trained).model_dump()  # a part of the state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at a checkpoint's position; batches drawn ahead before this are dropped."""
        loader = self.open()
        loader.load_state_dict(state)
        self._trained = loader.state_dict()["position"]

    def close(self) -> None:
        if self.loader is not None:
            self.loader.close()
            self.loader = None


def _dataset(loader: BatchLoader) -> TokenDataset:
    """The dataset a loader reads (both of Stalwart's loaders have one: its state at a position comes from it)."""
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, TokenDataset):
        raise TypeError(f"StalwartData needs one of Stalwart's loaders (with a dataset), not {type(loader).__name__}")
    return dataset


def _state_at(loader: BatchLoader, position: int) -> LoaderState:
    return state_at(_dataset(loader), position)


class _Schedulers:
    """The Trainer's LR schedulers as one Stateful (read when saved: configure_optimizers made them)."""

    def __init__(self, trainer: L.Trainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        return {str(i): config.scheduler.state_dict() for i, config in enumerate(self.trainer.lr_scheduler_configs)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        configs = self.trainer.lr_scheduler_configs
        if len(configs) != len(state):
            raise ValueError(f"the checkpoint holds {len(state)} LR scheduler(s), the Trainer has {len(configs)}")
        for i, config in enumerate(configs):
            config.scheduler.load_state_dict(dict(state[str(i)]))


class _Loops:
    """Lightning's fit loop counters (global step, epoch, batch progress) as Lightning's own
    checkpoints hold them: loaded before the loop runs, Lightning resumes as from its own checkpoint
    saved at a train batch's end."""

    def __init__(self, trainer: L.Trainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        return {"fit_loop": self.trainer.fit_loop.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.trainer.fit_loop.load_state_dict(dict(state["fit_loop"]))


class _Optimizers:
    """The model and every optimizer the Trainer holds, as TrainState saves a model and one."""

    def __init__(self, module: torch.nn.Module, trainer: L.Trainer) -> None:
        self.states = [TrainState(module, optim) for optim in trainer.optimizers] or [TrainState(module)]

    def state_dict(self) -> dict[str, Any]:
        return {str(i): s.state_dict() for i, s in enumerate(self.states)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if len(state) != len(self.states):
            raise ValueError(f"the checkpoint holds {len(state)} optimizer(s), the Trainer has {len(self.states)}")
        for i, s in enumerate(self.states):
            s.load_state_dict(dict(state[str(i)]))


class StalwartCallback(Callback):
    """Progress, checkpoints and exact resume for a Lightning fit under Stalwart (see the module).

    `data` is the StalwartData the fit trains on: its position rides in every checkpoint. Outside
    Stalwart it still checkpoints, to `checkpoint_uri` (a folder or any URI open_storage takes), and
    the SDK's reports are no-ops, so the same script runs under plain torchrun.
    """

    def __init__(
        self,
        data: StalwartData,
        *,
        checkpoint_uri: str = "checkpoints/lightning",
        interval: int = DEFAULT_INTERVAL,
        keep: int = DEFAULT_KEEP,
    ) -> None:
        super().__init__()
        if interval < 1 or keep < 1:
            raise ValueError(f"StalwartCallback: interval ({interval}) and keep ({keep}) must be at least 1")
        self.data = data
        self.clock = data.clock  # one figure: the callback's hooks and the data's bookkeeping
        self.checkpoint_uri = os.environ.get(contract.CHECKPOINT_URI) or checkpoint_uri
        self.interval = contract.int_var(contract.CHECKPOINT_INTERVAL) or interval
        self.keep = contract.int_var(contract.CHECKPOINT_KEEP) or keep
        self.resumed_from = 0
        self.checkpointer: Checkpointer | None = None
        self._periodic: PeriodicCheckpoints | None = None
        self._reported = 0
        self._last_end: float | None = None
        self._started = self._before_optimizer = 0.0
        self._data_time = self._compute_time = self._optimizer_time = 0.0
        # Lightning calls every step hook of every callback, used or not, each inside its profiler's
        # context (a few microseconds each); it skips an attribute that is not callable, so the step
        # hooks this callback leaves alone are None on the instance.
        for hook in _UNUSED_STEP_HOOKS:
            setattr(self, hook, None)

    # ------------------------------------------------------------------------------ checkpoints
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":  # the process group exists: one loader per data-parallel rank
            self.data.open(trainer.global_rank, trainer.world_size)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After the strategy set up the model and optimizers, before the loop runs: load the newest
        checkpoint (the newest a rollback allows: the engine reads contract.resume_max_step())."""
        started = time.perf_counter()
        self.checkpointer = Checkpointer(
            checkpoint_tiers(self.checkpoint_uri), retention=RetentionPolicy(keep_last=self.keep)
        )
        state = {
            "train": _Optimizers(pl_module, trainer),
            "schedulers": _Schedulers(trainer),
            "rng": RNGState(),
            "loops": _Loops(trainer),
            "data": self.data,
        }
        try:
            self.resumed_from = self.checkpointer.load(state, fallback=True)
        except NoCheckpoint:
            self.resumed_from = 0
        if self.resumed_from:
            report_load(self.resumed_from, time.perf_counter() - started, self.checkpointer.last_load_tier)
            log.info("resumed from the checkpoint at step %d (%s)", self.resumed_from, self.checkpointer.last_load_tier)
        self._reported = self.resumed_from
        last_step = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else -1
        self._periodic = PeriodicCheckpoints(self.checkpointer, state, self.data, self.interval, last_step)

    # ------------------------------------------------------------------------------------ steps
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        with self.clock:
            now = time.perf_counter()
            # Fetching this batch (and the one Lightning draws ahead) happened since the last batch ended.
            self._data_time += now - self._last_end if self._last_end is not None else 0.0
            self._started = self._before_optimizer = now

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        with self.clock:
            now = time.perf_counter()
            self._compute_time += now - self._started  # forward and backward, DDP's all-reduce included
            self._before_optimizer = now

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        with self.clock:  # one clocked section for the whole hook: the clock's own reads cost too
            now = time.perf_counter()
            if self._before_optimizer > self._started:
                self._optimizer_time += now - self._before_optimizer
            else:  # accumulating gradients: no optimizer step in this batch
                self._compute_time += now - self._started
            self.data.mark_trained(batch)
            step = trainer.global_step
            stepped = step > self._reported  # an optimizer step finished (every batch, unless accumulating)
            if stepped:
                loss = _rank_loss(outputs)
                # A NaN or infinite loss raises FloatingPointError here, and the job rolls back.
                report_step(
                    step,
                    loss=loss,
                    tokens=self.data.tokens_per_batch * max(1, trainer.accumulate_grad_batches),
                    step_time=None if self._last_end is None else now - self._last_end,
                    data_time=self._data_time,
                    compute_time=self._compute_time,
                    optimizer_time=self._optimizer_time,
                )
                self._reported = step
                self._data_time = self._compute_time = self._optimizer_time = 0.0
                self.clock.step_done()
        if stepped and self._periodic is not None:
            self._periodic.after_step(step)  # every `interval` steps; written while training goes on
        self._last_end = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._periodic is not None:
            self._periodic.finish()
        flush()  # the last reports go out now, not at the sender's next round
        self.clock.log_cost(log)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
            self.checkpointer = None
        self.data.close()


def _rank_loss(outputs: Any) -> float | None:
    """This rank's loss, read without a collective: an all-reduce per step only for the report cost
    the fit a few percent. A NaN or infinite loss on one rank raises there at once, and reaches every
    other rank at the next step through DDP's gradient all-reduce."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if not isinstance(loss, torch.Tensor):
        return None
    return float(loss)  # one read of a one-element tensor, no copy
