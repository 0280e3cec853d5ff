"""What crosses the data plane's wire: prompts, trajectory groups, and the requests that move them.

Every request is a JSON header with an `op`; the weights travel as a binary payload beside it.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from stalwart.rlhf.lineage import Lineage, WeightVersion

MAX_TOKENS = 1 << 16
MAX_GROUP = 1024
MAX_ITEMS = 1 << 16


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Stage(str, Enum):
    """What a prompt group waits for next, in order."""

    ROLLOUT = "rollout"  # to be generated from its prompt
    REWARD = "reward"  # to be scored
    REFERENCE = "reference"  # to get the reference policy's log-probabilities
    READY = "ready"  # for the actor


WORKER_STAGES = (Stage.ROLLOUT, Stage.REWARD, Stage.REFERENCE)


class PromptItem(Message):
    """One prompt of one actor step, as the deterministic data loader gave it."""

    sample_id: Annotated[int, Field(ge=0)]  # the loader's stable sample id (source, epoch, index)
    position: Annotated[int, Field(ge=0)]  # its global position in the loader's order
    step: Annotated[int, Field(ge=1)]  # the actor step that trains on it
    tokens: Annotated[list[int], Field(min_length=1, max_length=MAX_TOKENS)]


class Sample(Message):
    """One completion of a prompt, with the log-probabilities of the policy that generated it."""

    tokens: Annotated[list[int], Field(min_length=1, max_length=MAX_TOKENS)]
    logprobs: Annotated[list[float], Field(max_length=MAX_TOKENS)]

    @model_validator(mode="after")
    def _aligned(self) -> Sample:
        if len(self.logprobs) != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.logprobs)} log-probabilities")
        return self


class Group(Message):
    """A prompt's samples, filled in stage by stage: generated, scored, then referenced."""

    prompt: PromptItem
    version: WeightVersion  # the weights that generated the samples
    samples: Annotated[list[Sample], Field(min_length=1, max_length=MAX_GROUP)]
    rewards: list[float] | None = None
    ref_logprobs: list[list[float]] | None = None

    @model_validator(mode="after")
    def _aligned(self) -> Group:
        if self.rewards is not None and len(self.rewards) != len(self.samples):
            raise ValueError(f"{len(self.samples)} samples but {len(self.rewards)} rewards")
        if self.ref_logprobs is not None and [len(r) for r in self.ref_logprobs] != [
            len(s.tokens) for s in self.samples
        ]:
            raise ValueError("reference log-probabilities do not match the samples' lengths")
        return self


# ------------------------------------------------------------------------------------ requests
class Hello(Message):
    """The first message on a connection: who is calling, and the job's data-plane token."""

    op: Literal["hello"] = "hello"
    client: Annotated[str, Field(min_length=1, max_length=128)]
    channel: Annotated[str, Field(min_length=1, max_length=64)]
    token: Annotated[str, Field(max_length=256)] = ""


class Resume(Message):
    """The actor (re)starts: its lineage, and the loader position it resumes from (the watermark)."""

    op: Literal["resume"] = "resume"
    lineage: Lineage
    watermark: Annotated[int, Field(ge=0)]


class Advance(Message):
    """The actor trained on everything before `watermark`."""

    op: Literal["advance"] = "advance"
    incarnation: str
    watermark: Annotated[int, Field(ge=0)]


class Demand(Message):
    """Prompts the actor will train on soon (look-ahead): the relay starts them through the stages."""

    op: Literal["demand"] = "demand"
    incarnation: str
    items: Annotated[list[PromptItem], Field(max_length=MAX_ITEMS)]


class Take(Message):
    """Give me these prompts' groups once all are ready (demanding any the relay does not hold)."""

    op: Literal["take"] = "take"
    incarnation: str
    items: Annotated[list[PromptItem], Field(min_length=1, max_length=MAX_ITEMS)]
    wait_seconds: Annotated[float, Field(ge=0, le=60)] = 5.0


class Lease(Message):
    """A worker asks for up to `max_groups` groups waiting for its stage."""

    op: Literal["lease"] = "lease"
    stage: Stage
    max_groups: Annotated[int, Field(ge=1, le=MAX_ITEMS)] = 1
    have_version: WeightVersion | None = None  # rollouts: the weights they would generate with
    wait_seconds: Annotated[float, Field(ge=0, le=60)] = 5.0


class Submit(Message):
    """A worker returns the groups of its lease, with its stage's part filled in."""

    op: Literal["submit"] = "submit"
    stage: Stage
    lease_id: Annotated[str, Field(min_length=1, max_length=64)]
    groups: Annotated[list[Group], Field(max_length=MAX_ITEMS)]


class Finish(Message):
    """The actor is done: workers stop when they next ask for work."""

    op: Literal["finish"] = "finish"


class Stats(Message):
    op: Literal["stats"] = "stats"


class FetchWeights(Message):
    """A rollout asks for weights newer than the ones it has (any, if it has none)."""

    op: Literal["fetch"] = "fetch"
    newer_than: WeightVersion | None = None
    wait_seconds: Annotated[float, Field(ge=0, le=60)] = 5.0


REQUESTS: dict[str, type[Message]] = {
    m.model_fields["op"].default: m
    for m in (Hello, Resume, Advance, Demand, Take, Lease, Submit, Finish, Stats, FetchWeights)
}


# ----------------------------------------------------------------------------------- responses
LeaseStatus = Literal["ok", "empty", "need-newer-weights", "done"]


class LeaseReply(Message):
    status: LeaseStatus
    lease_id: str = ""
    prompts: list[PromptItem] = []  # rollout stage
    min_versions: list[int] = []  # rollout stage: the oldest weight step each prompt may use
    groups: list[Group] = []  # reward and reference stages


class SubmitReply(Message):
    accepted: int
    dropped: int  # from a lease given away, for a group no longer held, or from stale weights
    stale_weights: bool = False


class TakeReply(Message):
    ready: bool
    groups: list[Group] = []
    waiting: dict[str, int] = {}  # stage -> how many of the asked groups wait there (progress, logs)


class DemandReply(Message):
    accepted: int
    held: int  # already held (demanded before)
    refused: int  # below the watermark (consumed) or beyond the capacity


class WeightsMeta(Message):
    """Describes the payload: the version, its size and digest (checked before any use)."""

    version: WeightVersion | None = None  # None: nothing newer within the wait
    size: int = 0
    digest: str = ""


class ErrorReply(Message):
    error: str
