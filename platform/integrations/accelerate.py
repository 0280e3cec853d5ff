"""Stalwart for a hand-written `accelerate` loop: progress, step phases and exact checkpoints.

    loop = StalwartLoop(model=model, optimizer=optim, scheduler=sched, loader=loader, last_step=steps)
    start = loop.resume()                       # the newest checkpoint a rollback allows, else 0
    for step in range(start + 1, steps + 1):
        with loop.phase("data"):
            batch = loader.next_batch()
        with loop.phase("compute"):
            ...; accelerator.backward(loss)
        with loop.phase("optimizer"):
            optim.step(); sched.step(); optim.zero_grad()
        loop.step_done(step, loss.item(), batch)  # report, audit, checkpoint every CHECKPOINT_INTERVAL
    loop.finish()

`model` and `optimizer` are what `accelerator.prepare` returned (the wrappers are looked through);
`loader` is `stalwart.dataloader.open_loader`'s, whose position rides in every checkpoint. accelerate
itself is not imported here: the helper needs only what it is handed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import PeriodicCheckpoints, Phase, SampleLog, StepTimer, flush, report_load
from stalwart.checkpoint import Checkpointer, NoCheckpoint, RetentionPolicy, RNGState, TrainState
from stalwart.dataloader.batch import Batch, BatchLoader
from stalwart.integrations.common import HookClock, SchedulerState, checkpoint_tiers


class StalwartLoop:
    """Reports each step to the node agent and checkpoints model, optimizer, scheduler, RNG and the
    loader's position, asynchronously, to the tiers the agent gives (`checkpoint_dir` outside Stalwart)."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        optimizer: Any,
        loader: BatchLoader,
        last_step: int,
        scheduler: Any = None,
        checkpoint_dir: str | None = None,
        sample_log: str | None = None,
    ) -> None:
        self.loader = loader
        self.timer = StepTimer()
        self.clock = HookClock()  # step_done's own time on the training thread, the periodic saves left out
        self.samples = SampleLog(sample_log)
        self.state: dict[str, Any] = {
            "train": TrainState(model, getattr(optimizer, "optimizer", optimizer)),  # AcceleratedOptimizer's own
            "rng": RNGState(),
            "data": loader,
        }
        if scheduler is not None:
            self.state["schedule"] = SchedulerState(scheduler)
        tiers = checkpoint_tiers(checkpoint_dir)
        keep = contract.int_var(contract.CHECKPOINT_KEEP) or 3
        self.checkpointer = Checkpointer(tiers, retention=RetentionPolicy(keep_last=keep)) if tiers else None
        interval = contract.int_var(contract.CHECKPOINT_INTERVAL) or 10
        self._periodic = (
            PeriodicCheckpoints(self.checkpointer, self.state, loader, interval, last_step)
            if self.checkpointer is not None
            else None
        )

    def resume(self) -> int:
        """Load the newest checkpoint (or the newest a rollback allows); the step to continue after."""
        if self.checkpointer is None:
            return 0
        started = time.perf_counter()
        try:
            step = self.checkpointer.load(self.state, fallback=True)
        except NoCheckpoint:
            return 0
        report_load(step, time.perf_counter() - started, self.checkpointer.last_load_tier)
        self.timer = StepTimer()
        return step

    @contextmanager
    def phase(self, name: Phase) -> Iterator[None]:
        """Time a part of the step: data, compute, optimizer or comm."""
        with self.timer.phase(name):
            yield

    def step_done(self, step: int, loss: float | None, batch: Batch | None = None) -> float:
        """Report the step (a NaN or infinite loss raises FloatingPointError: the job rolls back), write
        its sample ids to the audit, and checkpoint every CHECKPOINT_INTERVAL steps. Returns the step time."""
        with self.clock:
            tokens = None
            if batch is not None:
                tokens = int(batch.tokens.shape[0] * (batch.tokens.shape[1] - 1))
            elapsed = self.timer.report(step, loss=loss, tokens=tokens)
            if batch is not None and self.samples.enabled:
                self.samples.write(step, batch.sample_ids.tolist())
            self.clock.step_done()
        if self._periodic is not None:
            self._periodic.after_step(step)
        return elapsed

    def finish(self) -> None:
        """Wait for the last save, report it, and close the checkpointer and the audit."""
        if self._periodic is not None:
            self._periodic.finish()
        flush()  # the last reports go out now, not at the sender's next round
        if self.checkpointer is not None:
            self.checkpointer.close()
        self.samples.close()
