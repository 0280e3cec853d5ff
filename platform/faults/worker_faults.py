"""Faults injected into training processes: the hooks this package installs through the worker
SDK's hook module (stalwart.agents.fault_hooks), when the worker's environment asks for them.

- Signals from the injector (`stalwart run --inject`): SIGUSR2 hangs the rank at its next step,
  before its next collective, as a real hang would; SIGRTMIN+1 makes every later step slower
  (a throttled GPU, a flapping link); SIGRTMIN+2 makes its data loading alone slower (a slow
  filesystem or a starved loader); SIGRTMIN+3 its optimizer step alone (an offloaded optimizer on a
  busy CPU); SIGRTMIN+4 makes its next reported loss LOSS_SPIKE_FACTOR times what it computed (a
  loss spike: the controller rolls back).
- A bad machine no check catches: its workers die, with no message, a few steps into every run.
- A hang of the whole job: every rank of the first generation stops at one step, waiting to receive
  from the next rank, which never sends: no rank stands out, so nothing names a suspect.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from statistics import median

from pydantic import BaseModel, ConfigDict, Field

from stalwart import worker_contract as contract
from stalwart.agents import fault_hooks

HANG_SIGNAL = signal.SIGUSR2
SLOW_SIGNAL: int = signal.SIGRTMIN + 1
SLOW_DATA_SIGNAL: int = signal.SIGRTMIN + 2
SLOW_OPTIMIZER_SIGNAL: int = signal.SIGRTMIN + 3
LOSS_SPIKE_SIGNAL: int = signal.SIGRTMIN + 4
LOSS_SPIKE_FACTOR = 100.0  # far above any lossSpikeFactor a job would set (default 5)
HANG_LIMIT_SECONDS = 3600.0  # an injected hang ends by itself after this: nothing waits forever
SLOW_STEP_SECONDS = 0.4  # what each step of a slowed rank pays, before its next collective (default)
SLOW_DATA_SECONDS = 0.4  # what each batch of a rank with slow data loading pays (default)
CRASH_EXIT_CODE = 134
STEP_HISTORY = 20  # steps whose median is the step time a slow fault's factor multiplies


class WorkerFaults(BaseModel):
    """What to install in a worker (STALWART_FAULT_HOOKS, as JSON)."""

    model_config = ConfigDict(extra="forbid")

    signals: bool = Field(default=False, description="answer the injector's hang and slow signals")
    crash_after_steps: int | None = Field(default=None, ge=1, description="die silently after this many steps")
    hang_at_step: int | None = Field(
        default=None, ge=0, description="every rank stops at this step, in the job's first generation only"
    )
    slow_step_seconds: float = Field(default=SLOW_STEP_SECONDS, gt=0, description="a slowed rank's delay per step")
    slow_data_seconds: float = Field(default=SLOW_DATA_SECONDS, gt=0, description="a slow loader's delay per batch")
    # A factor instead of seconds: the slowed rank's steps take this many times its own step time
    # before the fault (the median of its last STEP_HISTORY steps, fixed at the first slowed step).
    slow_step_factor: float | None = Field(default=None, gt=1, le=100, description="a slowed rank's step, x")
    slow_data_factor: float | None = Field(default=None, gt=1, le=100, description="a slow loader's step, x")
    slow_optimizer_seconds: float = Field(default=SLOW_DATA_SECONDS, gt=0, description="a slow optimizer's delay")
    slow_optimizer_factor: float | None = Field(default=None, gt=1, le=100, description="a slow optimizer's step, x")


class _Armed:
    """What the signals have asked for so far (set from signal handlers, read at the hooks)."""

    def __init__(self, faults: WorkerFaults) -> None:
        self.faults = faults
        self.hang = self.slow = self.slow_data = self.slow_optimizer = self.loss_spike = False
        self.steps = 0
        self._intervals: deque[float] = deque(maxlen=STEP_HISTORY)  # the rank's recent step times
        self._last_step_at: float | None = None
        self._delays: dict[str, float] = {}  # "step"/"data" -> seconds, fixed at the first slowed step

    def _delay(self, what: str, seconds: float, factor: float | None) -> float:
        """The delay to add: `seconds`, or (factor - 1) x the rank's step time before the fault."""
        if factor is None:
            return seconds
        if what not in self._delays:
            self._delays[what] = (factor - 1) * (median(self._intervals) if self._intervals else seconds)
        return self._delays[what]

    def at_step(self, step: int) -> None:
        now = time.monotonic()
        if self._last_step_at is not None and not (self.slow or self.slow_data or self.slow_optimizer):
            self._intervals.append(now - self._last_step_at)
        self._last_step_at = now
        if self.hang:
            _injected_hang()
        if self._job_hangs(step):
            _injected_job_hang()
        if self.slow:
            time.sleep(self._delay("step", self.faults.slow_step_seconds, self.faults.slow_step_factor))
        self.steps += 1
        if self.faults.crash_after_steps and self.steps >= self.faults.crash_after_steps:
            os._exit(CRASH_EXIT_CODE)  # a machine that kills its workers with no message

    def _job_hangs(self, step: int) -> bool:
        at = self.faults.hang_at_step
        return at is not None and step >= at and os.environ.get(contract.GENERATION) == "1"

    def reported_loss(self, _step: int, loss: float | None) -> float | None:
        """Once, after the signal: the next loss reported (a rank that reports none has no spike)."""
        if not self.loss_spike or loss is None:
            return loss
        self.loss_spike = False
        return loss * LOSS_SPIKE_FACTOR

    def at_phase(self, phase: str) -> None:
        if phase == "data" and self.slow_data:
            time.sleep(self._delay("data", self.faults.slow_data_seconds, self.faults.slow_data_factor))
        if phase == "optimizer" and self.slow_optimizer:
            f = self.faults
            time.sleep(self._delay("optimizer", f.slow_optimizer_seconds, f.slow_optimizer_factor))

    def arm(self, signum: int, _frame: object) -> None:
        if signum == HANG_SIGNAL:
            self.hang = True
        elif signum == SLOW_SIGNAL:
            self.slow = True
        elif signum == SLOW_DATA_SIGNAL:
            self.slow_data = True
        elif signum == SLOW_OPTIMIZER_SIGNAL:
            self.slow_optimizer = True
        elif signum == LOSS_SPIKE_SIGNAL:
            self.loss_spike = True


def _injected_hang() -> None:
    """Where an injected hang waits: a rank stuck before its next collective, as a real one would be."""
    deadline = time.monotonic() + HANG_LIMIT_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.1)


def _injected_job_hang() -> None:
    """Where a hang of the whole job waits: every rank in a receive from the next one, which never
    sends (until the process group's timeout, 30 minutes by default), as when a job's communication
    lost its way; the stacks all wait alike and no wait leads to anyone. A rank without a process
    group hangs as `_injected_hang` does."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rank, world = dist.get_rank(), dist.get_world_size()
        try:
            dist.recv(torch.zeros(1), src=(rank + 1) % world)
        except RuntimeError:
            pass  # the group's timeout: hang on
    _injected_hang()


def install(config: str) -> None:
    """Register this worker's faults with the SDK's hook module (called by fault_hooks.load)."""
    faults = WorkerFaults.model_validate_json(config)
    armed = _Armed(faults)
    if faults.signals and threading.current_thread() is threading.main_thread():
        for signum in (HANG_SIGNAL, SLOW_SIGNAL, SLOW_DATA_SIGNAL, SLOW_OPTIMIZER_SIGNAL, LOSS_SPIKE_SIGNAL):
            signal.signal(signum, armed.arm)
    fault_hooks.on_step(armed.at_step)
    fault_hooks.on_phase(armed.at_phase)
    fault_hooks.on_loss(armed.reported_loss)
