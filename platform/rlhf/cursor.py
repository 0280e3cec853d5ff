"""The actor's place on the data plane, saved in its checkpoints so a restart resumes exactly."""

from __future__ import annotations

from typing import Any

from stalwart.rlhf.lineage import Lineage


class RelayCursor:
    """The consumed-trajectory watermark (the loader position before which everything was trained on)
    and the lineage of actor incarnations. A checkpoint Stateful: plain values, any layout loads it."""

    def __init__(self) -> None:
        self.watermark = 0
        self.lineage = Lineage()

    def state_dict(self) -> dict[str, Any]:
        return {"watermark": self.watermark, "lineage": self.lineage.model_dump_json()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.watermark = int(state["watermark"])
        self.lineage = Lineage.model_validate_json(state["lineage"])
