"""Recorded outputs in place of a machine's own, for the probes of named nodes.

A development machine has no GPU and no InfiniBand, so a test (or a demo) that must show a node
refused for a missing GPU or a NIC that is down gives that node's agent what a machine with the
fault printed: a `nvidia-smi -q` text, a `/sys` tree, a kernel log (tests/data/health/ holds real
ones). The agent's environment names them per node, `"*"` for every node not named:

    STALWART_PROBE_RECORDINGS='{"node-1": {"nvidiaSmiQ": "/path/gpu.txt", "sysfsRoot": "/path/sys"}}'

The probes then judge the recording exactly as they judge the machine (nothing else changes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

RECORDINGS_ENV = "STALWART_PROBE_RECORDINGS"


class RecordedOutputs(BaseModel):
    """What one node's probes read instead of its machine; a reader not named reads the machine."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    nvidia_smi_q: Path | None = Field(default=None, alias="nvidiaSmiQ", description="`nvidia-smi -q` text")
    sysfs_root: Path | None = Field(default=None, alias="sysfsRoot", description="a tree in /sys's layout")
    kernel_log: Path | None = Field(
        default=None, alias="kernelLog", description="kernel log lines, dated as `dmesg --time-format iso` prints"
    )

    def read_kernel_log(self) -> list[str] | None:
        """The recorded lines, which the agent's window then filters as it filters dmesg's."""
        return self.kernel_log.read_text().splitlines() if self.kernel_log is not None else None

    def read_nvidia_smi_q(self) -> str | None:
        """The recorded text (NVML is then not asked: the recording stands for the whole GPU reader)."""
        return self.nvidia_smi_q.read_text() if self.nvidia_smi_q is not None else None


def recorded_outputs(node: str, env: Mapping[str, str] = os.environ) -> RecordedOutputs | None:
    """`node`'s recordings (else the `"*"` entry's), or None: the machine's own readers."""
    text = env.get(RECORDINGS_ENV)
    if not text:
        return None
    try:
        table = json.loads(text)
        if not isinstance(table, dict):
            raise ValueError("expected an object of node name -> recordings")
        entry = table.get(node, table.get("*"))
        return RecordedOutputs.model_validate(entry) if entry is not None else None
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"{RECORDINGS_ENV} (node {node}): {exc}") from None
