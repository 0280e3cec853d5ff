"""Which weight versions are still part of the actor's history.

Each start of the actor is an incarnation that resumed from a step of the previous ones (0 for a
fresh start). A version (incarnation, step) is history if that incarnation is in the lineage and no
later incarnation resumed from an earlier step: weights the actor published after its last
checkpoint and then lost with a crash belong to a branch that no longer exists, so trajectories
generated with them are refused and generated again.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class WeightVersion(BaseModel):
    """The actor's weights after `step` optimizer steps, as published by one incarnation."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    incarnation: Annotated[str, Field(min_length=1, max_length=64)]
    step: Annotated[int, Field(ge=0)]

    def __str__(self) -> str:
        return f"{self.incarnation}@{self.step}"


class LineageEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    incarnation: Annotated[str, Field(min_length=1, max_length=64)]
    base_step: Annotated[int, Field(ge=0)]  # the checkpointed step it resumed from (0: from scratch)


class Lineage(BaseModel):
    """The incarnations of the actor, oldest first. Checkpointed with the actor, sent to the relay."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entries: list[LineageEntry] = []

    @property
    def current(self) -> LineageEntry | None:
        return self.entries[-1] if self.entries else None

    def extend(self, incarnation: str, base_step: int) -> Lineage:
        """The lineage of a new incarnation that resumed from `base_step`."""
        if any(e.incarnation == incarnation for e in self.entries):
            raise ValueError(f"incarnation {incarnation!r} is already in the lineage")
        return Lineage(entries=[*self.entries, LineageEntry(incarnation=incarnation, base_step=base_step)])

    def valid(self, version: WeightVersion) -> bool:
        for i, entry in enumerate(self.entries):
            if entry.incarnation == version.incarnation:
                later = [e.base_step for e in self.entries[i + 1 :]]
                return entry.base_step <= version.step <= min(later, default=version.step)
        return False
