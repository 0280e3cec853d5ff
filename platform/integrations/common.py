"""What every integration needs from the job's environment: the data config, the checkpoint tiers, and
an LR scheduler as a Stateful. No framework is imported here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stalwart import worker_contract as contract
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
