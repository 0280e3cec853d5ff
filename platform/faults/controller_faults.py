"""Faults injected into the controller, through its after-commit hook (production code keeps no
fault branch): `stalwart run --inject kill-controller-mid-recovery` makes the first controller die
right after it commits an eviction, before any of that decision's effects."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol

from stalwart.faults.spec import CONTROLLER_CRASH_ENV
from stalwart.logs import get_logger

KILLED_EXIT_CODE = 17


class Committed(Protocol):
    """What the hook reads of a committed decision (stalwart.controller.core.decision.Decision)."""

    @property
    def evicted(self) -> Sequence[str]: ...


def commit_hooks() -> list[Callable[[Committed], None]]:
    """The hooks the environment asks for (none in production)."""
    if os.environ.get(CONTROLLER_CRASH_ENV) == "after-evict":
        return [_die_after_eviction]
    return []


def _die_after_eviction(decision: Committed) -> None:
    if decision.evicted:
        get_logger("stalwart.faults").warning(
            "fault injection: controller dies right after committing an eviction",
            fields={"evicted": list(decision.evicted)},
        )
        os._exit(KILLED_EXIT_CODE)
