"""Faults injected into training processes: the hooks this package installs through the worker
SDK's hook module (stalwart.agents.fault_hooks), when the worker's environment asks for them.

- Signals from the injector (`stalwart run --inject`): SIGUSR2 hangs the rank at its next step,
  before its next collective, as a real hang would; SIGRTMIN+1 makes every later step slower
  (a throttled GPU, a flapping link); SIGRTMIN+2 makes its data loading alone slower (a slow
  filesystem or a starved loader).
- A bad machine no check catches: its workers die, with no message, a few steps into every run.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from pydantic import BaseModel, ConfigDict, Field

from stalwart.agents import fault_hooks

HANG_SIGNAL = signal.SIGUSR2
SLOW_SIGNAL: int = signal.SIGRTMIN + 1
SLOW_DATA_SIGNAL: int = signal.SIGRTMIN + 2
HANG_LIMIT_SECONDS = 3600.0  # an injected hang ends by itself after this: nothing waits forever
SLOW_STEP_SECONDS = 0.4  # what each step of a slowed rank pays, before its next collective (default)
SLOW_DATA_SECONDS = 0.4  # what each batch of a rank with slow data loading pays (default)
CRASH_EXIT_CODE = 134


class WorkerFaults(BaseModel):
    """What to install in a worker (STALWART_FAULT_HOOKS, as JSON)."""

    model_config = ConfigDict(extra="forbid")

    signals: bool = Field(default=False, description="answer the injector's hang and slow signals")
    crash_after_steps: int | None = Field(default=None, ge=1, description="die silently after this many steps")
    slow_step_seconds: float = Field(default=SLOW_STEP_SECONDS, gt=0, description="a slowed rank's delay per step")
    slow_data_seconds: float = Field(default=SLOW_DATA_SECONDS, gt=0, description="a slow loader's delay per batch")


class _Armed:
    """What the signals have asked for so far (set from signal handlers, read at the hooks)."""

    def __init__(self, faults: WorkerFaults) -> None:
        self.faults = faults
        self.hang = self.slow = self.slow_data = False
        self.steps = 0

    def at_step(self, _step: int) -> None:
        if self.hang:
            _injected_hang()
        if self.slow:
            time.sleep(self.faults.slow_step_seconds)
        self.steps += 1
        if self.faults.crash_after_steps and self.steps >= self.faults.crash_after_steps:
            os._exit(CRASH_EXIT_CODE)  # a machine that kills its workers with no message

    def at_phase(self, phase: str) -> None:
        if phase == "data" and self.slow_data:
            time.sleep(self.faults.slow_data_seconds)

    def arm(self, signum: int, _frame: object) -> None:
        if signum == HANG_SIGNAL:
            self.hang = True
        elif signum == SLOW_SIGNAL:
            self.slow = True
        elif signum == SLOW_DATA_SIGNAL:
            self.slow_data = True


def _injected_hang() -> None:
    """Where an injected hang waits: a rank stuck before its next collective, as a real one would be."""
    deadline = time.monotonic() + HANG_LIMIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.1)


def install(config: str) -> None:
    """Register this worker's faults with the SDK's hook module (called by fault_hooks.load)."""
    faults = WorkerFaults.model_validate_json(config)
    armed = _Armed(faults)
    if faults.signals and threading.current_thread() is threading.main_thread():
        for signum in (HANG_SIGNAL, SLOW_SIGNAL, SLOW_DATA_SIGNAL):
            signal.signal(signum, armed.arm)
    fault_hooks.on_step(armed.at_step)
    fault_hooks.on_phase(armed.at_phase)
