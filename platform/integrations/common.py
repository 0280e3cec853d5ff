"""What every integration needs from the job's environment: the data config, the checkpoint tiers, and
an LR scheduler as a Stateful. No framework is imported here."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from stalwart import worker_contract as contract
from stalwart.agents.worker_sdk import sender_cpu
from stalwart.checkpoint import Storage, open_storage
from stalwart.dataloader import DataConfig

# Scheduler state worth keeping: plain numbers (a LambdaLR's functions are code and stay in the script).
_SCHEDULER_KEYS = ("last_epoch", "_step_count", "base_lrs", "_last_lr", "_is_initial", "_get_lr_called_within_step")


def data_config_from_env(default: DataConfig) -> DataConfig:
    """The job spec's data section under Stalwart (it arrives in the environment), else `default`."""
    raw = os.environ.get(contract.DATA_CONFIG)
    return DataConfig.model_validate_json(raw) if raw else default


def checkpoint_tiers(default_dir: str | None) -> list[Storage]:
    """Where checkpoints go: the agent's host-memory tier then its storage, or `default_dir` outside Stalwart."""
    tiers = []
    if os.environ.get(contract.CHECKPOINT_MEMORY_URI):
        tiers.append(open_storage(os.environ[contract.CHECKPOINT_MEMORY_URI]))
    uri = os.environ.get(contract.CHECKPOINT_URI) or default_dir
    if uri:
        tiers.append(open_storage(uri))
    return tiers


class HookClock:
    """What an integration itself costs the training thread: the wall time and the thread's CPU time
    spent inside its hooks (`with clock: ...`), and the steps they served. The CPU time is the figure a
    shared machine cannot inflate much: another process's load delays a hook's wall time, not the CPU
    it uses. Beside it, the CPU the worker SDK's sender thread spent since the clock was made (building
    and sending the reports the hooks queued): the rest of what the integration adds to the process.

    The thread's CPU clock is a system call (a microsecond or more, and more again in a training step's
    cold caches), so it is read in one step of every CPU_SAMPLE_EVERY (the 2nd, the 10th, ...), and the
    CPU per step is the sampled steps' mean: steps alike cost alike, and the clock costs what it
    measures an eighth as often. The first step is never sampled: what it does once (the SDK's sender
    thread starts at the first report) is no step's cost. The wall clock (no system call) is read in
    every hook, the first step's included."""

    CPU_SAMPLE_EVERY = 8

    __slots__ = ("wall", "cpu", "steps", "sampled", "_wall_start", "_cpu_start", "_sampling", "_sender_start")

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.steps = self.sampled = 0  # steps served, and those whose CPU time was read
        self._wall_start = 0.0
        self._cpu_start = -1.0  # when the open section's CPU time is read (-1: not this step)
        self._sampling = False  # the first step is not sampled
        self._sender_start = sender_cpu()

    def __enter__(self) -> HookClock:
        self._wall_start = time.perf_counter()
        self._cpu_start = time.thread_time() if self._sampling else -1.0
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._cpu_start >= 0.0:
            self.cpu += time.thread_time() - self._cpu_start
        self.wall += time.perf_counter() - self._wall_start

    def step_done(self) -> None:
        self.steps += 1
        if self._sampling:
            self.sampled += 1
        self._sampling = self.steps % self.CPU_SAMPLE_EVERY == 1

    def per_step(self) -> dict[str, float]:
        """Seconds per step in the hooks ({"wall"; "cpu", the sampled steps' mean}), the sender
        thread's CPU seconds per step ("sender") and the steps counted; zeros before a step."""
        steps = max(self.steps, 1)
        sender = (sender_cpu() - self._sender_start) / steps
        cpu = self.cpu / max(self.sampled, 1)
        return {"wall": self.wall / steps, "cpu": cpu, "sender": sender, "steps": float(self.steps)}

    def log_cost(self, logger: logging.Logger) -> None:
        """Log the hooks' cost per step, once training ends."""
        cost = self.per_step()
        logger.info(
            "stalwart's hooks: %.1f us wall, %.1f us CPU per step over %d steps; its report sender: %.1f us CPU",
            cost["wall"] * 1e6,
            cost["cpu"] * 1e6,
            self.steps,
            cost["sender"] * 1e6,
        )


class SchedulerState:
    """An LR scheduler's counters as a Stateful (an accelerate `AcceleratedScheduler` is unwrapped)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = getattr(scheduler, "scheduler", scheduler)

    def state_dict(self) -> dict[str, Any]:
        state = self.scheduler.state_dict()
        return {k: state[k] for k in _SCHEDULER_KEYS if k in state}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        merged = {**self.scheduler.state_dict(), **{k: v for k, v in state.items() if k in _SCHEDULER_KEYS}}
        for key in ("base_lrs", "_last_lr"):  # lists come back as they were saved
            if key in merged and not isinstance(merged[key], list):
                merged[key] = list(merged[key])
        self.scheduler.load_state_dict(merged)
