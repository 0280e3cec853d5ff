"""What a probe reports: records that go to etcd, the heartbeat and /metrics.

A result is honest about absence: a probe that cannot read its hardware says NOT_AVAILABLE with the
reason, never OK. `machine_fault` is set only for high-confidence machine signals (Xid 79, an
uncorrectable ECC error, an InfiniBand port down, a full disk), the ones the controller may act on at
once without further diagnosis.
"""

from __future__ import annotations

import time
from enum import Enum

from pydantic import Field

from stalwart.store.records import Record

Reading = float | int | str | bool | None


class ProbeStatus(str, Enum):
    OK = "ok"
    DEGRADED = "degraded"  # works, but slower or closer to failing than it should be
    FAILED = "failed"  # the thing probed is broken
    NOT_AVAILABLE = "not_available"  # the probe could not read it (no hardware, no driver, no access)


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2, Severity.CRITICAL: 3}


class Finding(Record):
    """One observation worth reporting, about one subject (a GPU, a port, a mount)."""

    code: str  # stable identifier, e.g. "ecc_uncorrectable", "ib_port_down"
    severity: Severity
    message: str
    subject: str | None = None  # e.g. "gpu0 00000000:07:00.0", "mlx5_0 port 1", "/"
    machine_fault: bool = False
    failure_class: str | None = None  # set with machine_fault: the class the controller acts on
    evidence: list[str] = []  # raw lines or readings that support it (trimmed)


class ProbeResult(Record):
    probe: str
    status: ProbeStatus
    findings: list[Finding] = []
    readings: dict[str, Reading] = {}  # a short summary of the raw readings, flat and JSON-friendly
    machine_fault: bool = False
    failure_class: str | None = None  # the class of the worst machine fault, if any
    reason: str | None = None  # why NOT_AVAILABLE (or why FAILED), in words
    checked_at: float = Field(default_factory=time.time)

    @classmethod
    def not_available(cls, probe: str, reason: str) -> ProbeResult:
        return cls(probe=probe, status=ProbeStatus.NOT_AVAILABLE, reason=reason)

    @classmethod
    def from_findings(
        cls,
        probe: str,
        findings: list[Finding],
        readings: dict[str, Reading] | None = None,
    ) -> ProbeResult:
        """Status follows the worst finding: error/critical -> FAILED, warning -> DEGRADED."""
        worst = max((f.severity.rank for f in findings), default=Severity.INFO.rank)
        if worst >= Severity.ERROR.rank:
            status = ProbeStatus.FAILED
        elif worst == Severity.WARNING.rank:
            status = ProbeStatus.DEGRADED
        else:
            status = ProbeStatus.OK
        faults = sorted((f for f in findings if f.machine_fault), key=lambda f: -f.severity.rank)
        return cls(
            probe=probe,
            status=status,
            findings=findings,
            readings=readings or {},
            machine_fault=bool(faults),
            failure_class=faults[0].failure_class if faults else None,
            reason="; ".join(f.message for f in findings if f.severity.rank >= Severity.ERROR.rank) or None,
        )
