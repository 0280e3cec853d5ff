"""The loader's whole state: a seed, a global position and a fingerprint. Nothing per rank.

`position` counts the samples consumed by all data-parallel ranks together, so a job that resumes
with a different data-parallel size continues at exactly the next global sample. The per-step delta
is the same few bytes, which keeps an in-memory checkpoint tier current at no cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from stalwart.dataloader.dataset import TokenDataset
from stalwart.dataloader.errors import StateMismatch

STATE_VERSION = 1


class LoaderStateDelta(BaseModel):
    """What changes each step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    position: Annotated[int, Field(ge=0)]
    fingerprint: str


class LoaderState(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = STATE_VERSION
    seed: int
    position: Annotated[int, Field(ge=0)]
    fingerprint: str

    def apply(self, delta: LoaderStateDelta | Mapping[str, Any]) -> LoaderState:
        d = delta if isinstance(delta, LoaderStateDelta) else LoaderStateDelta.model_validate(dict(delta))
        return self.model_copy(update={"position": d.position, "fingerprint": d.fingerprint})

    @classmethod
    def coerce(cls, state: LoaderState | Mapping[str, Any]) -> LoaderState:
        if isinstance(state, LoaderState):
            return state
        try:
            return cls.model_validate(dict(state))
        except ValueError as exc:
            raise StateMismatch(f"not a loader state: {exc}") from None


def state_at(dataset: TokenDataset, position: int) -> LoaderState:
    return LoaderState(seed=dataset.config.seed, position=position, fingerprint=dataset.fingerprint(position))


def delta_at(dataset: TokenDataset, position: int) -> LoaderStateDelta:
    return LoaderStateDelta(position=position, fingerprint=dataset.fingerprint(position))


def check_state(dataset: TokenDataset, state: LoaderState) -> None:
    """Refuse a state saved for other data, another seed, or a different mixture history."""
    if state.version != STATE_VERSION:
        raise StateMismatch(f"loader state version {state.version}; this build reads version {STATE_VERSION}")
    if state.seed != dataset.config.seed:
        raise StateMismatch(f"loader state has seed {state.seed}, the data config has seed {dataset.config.seed}")
    expected = dataset.fingerprint(state.position)
    if state.fingerprint != expected:
        raise StateMismatch(
            f"loader state at sample {state.position} was saved for other data or another mixture history "
            f"(fingerprint {state.fingerprint}, this config gives {expected}). Shards, seq_len and the weights "
            f"of samples already consumed must not change; to change the mixture, add a schedule milestone at "
            f"or after sample {state.position}."
        )
