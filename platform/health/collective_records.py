"""Records of the collective and compute checks: per check, per rank, per node, and the whole run.

A rank writes its RankReport to a file as it goes (phase by phase), so a rank that hangs or dies
still tells the runner how far it got; that is how a hung participant is told from its victims.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from stalwart.store.records import Record

# How the runner hands a check rank its settings (here, not in the torch-importing worker module:
# the node agent starts check ranks and must never import torch).
RESULT_ENV = "STALWART_HEALTH_RESULT"
NUMEL_ENV = "STALWART_HEALTH_NUMEL"
TIMEOUT_ENV = "STALWART_HEALTH_COLLECTIVE_TIMEOUT"
RENDEZVOUS_TIMEOUT_ENV = "STALWART_HEALTH_RENDEZVOUS_TIMEOUT"
BACKEND_ENV = "STALWART_HEALTH_BACKEND"

# The phases a rank passes through (the checks repeat, once per group it belongs to).
PHASES = ("started", "rendezvous", "joined", "all_to_all", "all_reduce", "all_gather", "compute", "done")


class CheckResult(Record):
    name: str  # all_to_all, all_reduce, all_gather
    group: list[int]  # the global ranks taking part
    passed: bool
    numel: int = 0
    latency_s: float | None = None  # median time of a one-element op
    seconds_per_op: float | None = None  # median time of the sized op
    bus_bandwidth_gbps: float | None = None  # GB/s (1e9 bytes), nccl-tests' busbw
    mismatches: int = 0  # elements that differ from the exact expected result
    error: str | None = None


class RankReport(Record):
    rank: int
    node: int
    local_rank: int
    pid: int = 0
    backend: str = ""
    device: str = ""
    phase: str = "started"
    progress: int = 0  # phases entered so far: a rank behind its peers is the laggard
    finished: bool = False
    checks: list[CheckResult] = []
    compute_digest: str | None = None
    compute_mismatch_ranks: list[int] = []  # as this rank saw the gathered digests
    error: str | None = None

    def enter(self, phase: str, path: Path) -> None:
        self.phase = phase
        self.progress += 1
        self.write(path)

    def write(self, path: Path) -> None:
        """Atomically, so the runner never reads half a report."""
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.dumps())
        os.replace(tmp, path)


class NodeVerdict(Record):
    node: int
    ranks: list[int]
    passed: bool
    reasons: list[str] = []


class CollectiveCheckReport(Record):
    passed: bool
    backend: str
    nodes: list[NodeVerdict]
    ranks: list[RankReport]
    timed_out_ranks: list[int] = []  # still running at the deadline (or stalled): stopped by the runner
    exit_codes: dict[int, int | None] = {}
    started_at: float
    finished_at: float = Field(default=0.0)

    @property
    def failed_nodes(self) -> list[int]:
        return [n.node for n in self.nodes if not n.passed]
