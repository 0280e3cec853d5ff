"""The one place where injected faults reach a training process.

The worker SDK calls `at_step` once per reported step, `reported_loss` for the loss it reports and
`at_phase` as each timed phase of a step starts; with no fault injected they do nothing. Production
code has no fault branches: the faults package (stalwart.faults.worker_faults) registers its hooks
here, and it is imported only when the worker's environment names faults (STALWART_FAULT_HOOKS, set
by `stalwart run --inject`), so a production worker never loads it. The import is by name because
the faults package sits above the agents in the layers: this module is the plug-in point, not a
dependency.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from stalwart import worker_contract as contract

FAULTS_MODULE = "stalwart.faults.worker_faults"

StepHook = Callable[[int], None]
PhaseHook = Callable[[str], None]
LossHook = Callable[[int, float | None], float | None]

_step_hooks: list[StepHook] = []
_phase_hooks: list[PhaseHook] = []
_loss_hooks: list[LossHook] = []
_loaded = False


def on_step(hook: StepHook) -> None:
    """Call `hook(step)` at every reported step, before the report goes out."""
    _step_hooks.append(hook)


def on_phase(hook: PhaseHook) -> None:
    """Call `hook(phase)` as a timed phase ("data", "compute", "optimizer", "comm") starts."""
    _phase_hooks.append(hook)


def on_loss(hook: LossHook) -> None:
    """Let `hook(step, loss)` say the loss a step reports (an injected loss spike)."""
    _loss_hooks.append(hook)


def load() -> None:
    """Install the faults the environment names (once); nothing at all without them."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    config = os.environ.get(contract.FAULT_HOOKS)
    if config:
        importlib.import_module(FAULTS_MODULE).install(config)


def at_step(step: int) -> None:
    for hook in _step_hooks:
        hook(step)


def at_phase(phase: str) -> None:
    for hook in _phase_hooks:
        hook(phase)


def reported_loss(step: int, loss: float | None) -> float | None:
    for hook in _loss_hooks:
        loss = hook(step, loss)
    return loss


def reset() -> None:
    """Forget every hook (tests)."""
    global _loaded
    _step_hooks.clear()
    _phase_hooks.clear()
    _loss_hooks.clear()
    _loaded = False
