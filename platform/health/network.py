"""The network probe: NIC and InfiniBand port state and error counters from sysfs.

The reader takes the sysfs root, so tests point it at a fixture tree; the evaluation is pure and
compares two readings to see counters move. `parse_ibstat` reads `ibstat` text, for recorded
outputs and hosts where only the tool's output is at hand.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import Field

from stalwart.health.records import Finding, ProbeResult, Reading, Severity
from stalwart.store.records import Record

PROBE = "network"

# Drops are left out: a NIC drops packets of protocols nobody listens to, in normal operation.
NIC_ERROR_COUNTERS = (
    "rx_errors",
    "tx_errors",
    "rx_crc_errors",
    "rx_frame_errors",
    "rx_missed_errors",
    "tx_carrier_errors",
)
IB_ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
)
# enum ib_port_state and ib_port_phys_state (include/rdma/ib_verbs.h), as sysfs and ibstat print them.
IB_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
IB_PHYS_STATES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}


class NicReading(Record):
    name: str
    operstate: str  # up, down, unknown, dormant, ...
    carrier: int | None = None
    carrier_changes: int | None = None
    mtu: int | None = None
    counters: dict[str, int] = {}


class IbPortReading(Record):
    device: str
    port: int
    state: str  # DOWN, INIT, ARMED, ACTIVE
    state_code: int | None = None
    phys_state: str | None = None  # Polling, LinkUp, Disabled, ...
    phys_state_code: int | None = None
    rate: str | None = None
    link_layer: str | None = None  # InfiniBand or Ethernet (RoCE)
    counters: dict[str, int] = {}

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"


class NetReadings(Record):
    nics: list[NicReading] = []
    ib_ports: list[IbPortReading] = []
    read_at: float = Field(default_factory=time.time)


def parse_ib_state(text: str) -> tuple[int | None, str]:
    """`4: ACTIVE` -> (4, "ACTIVE"); a bare name has no code."""
    m = re.match(r"^\s*(\d+)\s*:\s*(.+?)\s*$", text)
    if m:
        return int(m.group(1)), m.group(2)
    return None, text.strip()


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _counters(directory: Path, names: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in names:
        v = _int(_read(directory / n))
        if v is not None:
            out[n] = v
    return out


def read_net_sysfs(root: Path | str = "/sys") -> NetReadings:
    """NICs under class/net and RDMA ports under class/infiniband of the sysfs tree at `root`."""
    root = Path(root)
    nics: list[NicReading] = []
    net = root / "class" / "net"
    for d in sorted(net.iterdir()) if net.is_dir() else []:
        nics.append(
            NicReading(
                name=d.name,
                operstate=_read(d / "operstate") or "unknown",
                carrier=_int(_read(d / "carrier")),
                carrier_changes=_int(_read(d / "carrier_changes")),
                mtu=_int(_read(d / "mtu")),
                counters=_counters(d / "statistics", NIC_ERROR_COUNTERS),
            )
        )
    ports: list[IbPortReading] = []
    ib = root / "class" / "infiniband"
    for dev in sorted(ib.iterdir()) if ib.is_dir() else []:
        port_dir = dev / "ports"
        for p in sorted(port_dir.iterdir(), key=lambda x: _int(x.name) or 0) if port_dir.is_dir() else []:
            code, state = parse_ib_state(_read(p / "state") or "")
            phys = _read(p / "phys_state")
            pcode, pstate = parse_ib_state(phys) if phys is not None else (None, None)
            ports.append(
                IbPortReading(
                    device=dev.name,
                    port=_int(p.name) or 0,
                    state=state or "UNKNOWN",
                    state_code=code,
                    phys_state=pstate,
                    phys_state_code=pcode,
                    rate=_read(p / "rate"),
                    link_layer=_read(p / "link_layer"),
                    counters=_counters(p / "counters", IB_ERROR_COUNTERS),
                )
            )
    return NetReadings(nics=nics, ib_ports=ports)


def parse_ibstat(text: str) -> list[IbPortReading]:
    """Ports from `ibstat` output: `CA 'mlx4_0'` blocks with `Port N:` sections."""
    ports: list[IbPortReading] = []
    device: str | None = None
    current: dict[str, str] | None = None
    port_no = 0

    def flush() -> None:
        if device is not None and current is not None:
            state = current.get("state", "UNKNOWN").upper()
            phys = current.get("physical state")
            code = next((c for c, n in IB_STATES.items() if n == state), None)
            pcode = next((c for c, n in IB_PHYS_STATES.items() if phys and n.lower() == phys.lower()), None)
            ports.append(
                IbPortReading(
                    device=device,
                    port=port_no,
                    state=state,
                    state_code=code,
                    phys_state=phys,
                    phys_state_code=pcode,
                    rate=current.get("rate"),
                    link_layer=current.get("link layer"),
                )
            )

    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"^CA '([^']+)'", s)
        if m:
            flush()
            device, current = m.group(1), None
            continue
        m = re.match(r"^Port (\d+):$", s)
        if m:
            flush()
            port_no, current = int(m.group(1)), {}
            continue
        if current is not None and ":" in s:
            k, v = s.split(":", 1)
            current[k.strip().lower()] = v.strip()
    flush()
    return ports


def parse_ibstatus(text: str) -> list[IbPortReading]:
    """Ports from `ibstatus` output, which prints the sysfs values (`state: 4: ACTIVE`)."""
    ports: list[IbPortReading] = []
    fields: dict[str, str] = {}
    head: tuple[str, int] | None = None

    def flush() -> None:
        if head is not None:
            code, state = parse_ib_state(fields.get("state", ""))
            pcode, pstate = parse_ib_state(fields["phys state"]) if "phys state" in fields else (None, None)
            ports.append(
                IbPortReading(
                    device=head[0],
                    port=head[1],
                    state=state or "UNKNOWN",
                    state_code=code,
                    phys_state=pstate,
                    phys_state_code=pcode,
                    rate=fields.get("rate"),
                    link_layer=fields.get("link_layer"),
                )
            )

    for line in text.splitlines():
        m = re.match(r"^Infiniband device '([^']+)' port (\d+) status:", line.strip())
        if m:
            flush()
            head, fields = (m.group(1), int(m.group(2))), {}
        elif head is not None and ":" in line:
            k, v = line.strip().split(":", 1)
            fields[k.strip()] = v.strip()
    flush()
    return ports


def error_deltas(now: NetReadings, previous: NetReadings | None) -> dict[str, int]:
    """How much each error counter grew since `previous`, per NIC or port (counter resets read as 0)."""
    if previous is None:
        return {}
    out: dict[str, int] = {}
    before_nics = {n.name: n for n in previous.nics}
    for n in now.nics:
        b = before_nics.get(n.name)
        if b is None:
            continue
        out.update(_grown(n.name, b.counters, n.counters))
        if n.carrier_changes is not None and b.carrier_changes is not None and n.carrier_changes > b.carrier_changes:
            out[f"{n.name}:carrier_changes"] = n.carrier_changes - b.carrier_changes
    before_ports = {p.key: p for p in previous.ib_ports}
    for p in now.ib_ports:
        if (bp := before_ports.get(p.key)) is not None:
            out.update(_grown(p.key, bp.counters, p.counters))
    return out


def _grown(label: str, before: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    """Counters that grew, as 'label:counter' -> growth (a counter missing before counts as unchanged)."""
    return {f"{label}:{k}": v - before.get(k, v) for k, v in now.items() if v - before.get(k, v) > 0}


def evaluate_network(
    now: NetReadings,
    previous: NetReadings | None = None,
    *,
    required_nics: Sequence[str] | None = None,
) -> ProbeResult:
    """IB port down (machine fault unless administratively disabled), required NIC down, counters moving.

    NICs not in `required_nics` (the ones the job's traffic uses) are reported as info only when down:
    a spare port being down is not this job's problem.
    """
    findings: list[Finding] = []
    for p in now.ib_ports:
        subject = f"{p.device} port {p.port}"
        evidence = [f"state: {p.state_code}: {p.state}", f"phys_state: {p.phys_state_code}: {p.phys_state}"]
        if p.state in ("ACTIVE", "ACTIVE_DEFER"):
            continue
        if (p.phys_state or "").lower() == "disabled":
            findings.append(
                Finding(
                    code="ib_port_disabled",
                    severity=Severity.INFO,
                    subject=subject,
                    message=f"{subject} is administratively disabled",
                    evidence=evidence,
                )
            )
        elif p.state == "DOWN":
            findings.append(
                Finding(
                    code="ib_port_down",
                    severity=Severity.CRITICAL,
                    subject=subject,
                    machine_fault=True,
                    failure_class="ib_port_down",
                    message=f"{subject} is down (physical state {p.phys_state})",
                    evidence=evidence,
                )
            )
        else:
            findings.append(
                Finding(
                    code="ib_port_not_active",
                    severity=Severity.WARNING,
                    subject=subject,
                    message=f"{subject} is {p.state}, not ACTIVE",
                    evidence=evidence,
                )
            )
    required = set(required_nics or ())
    for n in now.nics:
        if n.name == "lo" or n.operstate in ("up", "unknown"):
            continue
        if n.name in required:
            findings.append(
                Finding(
                    code="nic_down",
                    severity=Severity.CRITICAL,
                    subject=n.name,
                    machine_fault=True,
                    failure_class="nic_down",
                    message=f"{n.name} is {n.operstate}",
                )
            )
        else:
            findings.append(
                Finding(
                    code="nic_not_up",
                    severity=Severity.INFO,
                    subject=n.name,
                    message=f"{n.name} is {n.operstate} (not used by the job)",
                )
            )
    for missing in sorted(required - {x.name for x in now.nics}):
        findings.append(
            Finding(
                code="nic_missing",
                severity=Severity.CRITICAL,
                subject=missing,
                machine_fault=True,
                failure_class="nic_down",
                message=f"{missing} does not exist",
            )
        )
    deltas = error_deltas(now, previous)
    for key, d in sorted(deltas.items()):
        flap = key.endswith(":carrier_changes") or key.endswith(":link_downed")
        findings.append(
            Finding(
                code="link_flap" if flap else "link_errors",
                severity=Severity.WARNING,
                subject=key,
                message=f"{key} grew by {d}",
            )
        )
    summary: dict[str, Reading] = {
        "nics_up": sum(n.operstate == "up" for n in now.nics),
        "ib_ports": len(now.ib_ports),
        "ib_ports_active": sum(p.state == "ACTIVE" for p in now.ib_ports),
        "error_counter_delta": sum(deltas.values()),
    }
    return ProbeResult.from_findings(PROBE, findings, summary)


class NetworkProbe:
    """Keeps the previous reading, so each run reports the counters that moved since the last."""

    name = PROBE

    def __init__(self, sysfs_root: Path | str = "/sys", required_nics: Sequence[str] | None = None) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.required_nics = list(required_nics or [])
        self.previous: NetReadings | None = None

    def run(self) -> ProbeResult:
        if not (self.sysfs_root / "class" / "net").is_dir():
            return ProbeResult.not_available(PROBE, f"no sysfs network tree under {self.sysfs_root}")
        now = read_net_sysfs(self.sysfs_root)
        result = evaluate_network(now, self.previous, required_nics=self.required_nics)
        self.previous = now
        return result
