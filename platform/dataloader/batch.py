"""What a loader hands the trainer, and the interface both loaders (in-process, shadow) share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

ServedBy = Literal["local", "shadow"]


@dataclass(frozen=True)
class Batch:
    """This rank's share of one global batch."""

    tokens: torch.Tensor  # int64 [micro_batch, seq_len + 1]: inputs tokens[:, :-1], targets tokens[:, 1:]
    sample_ids: torch.Tensor  # int64 [micro_batch], stable ids (see sample_id.decode)
    position: int  # global position of the global batch's first sample (the same on every rank)
    dp_rank: int
    dp_size: int
    served_by: ServedBy = "local"

    @property
    def micro_batch(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def next_position(self) -> int:
        return self.position + self.dp_size * self.micro_batch


class BatchLoader(Protocol):
    position: int

    def next_batch(self) -> Batch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Any) -> None: ...

    def state_delta(self) -> dict[str, Any]: ...

    def close(self) -> None: ...
