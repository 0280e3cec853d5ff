"""The kernel log: NVIDIA Xid events, OOM-killer kills and panics, parsed from its lines.

The parsers are pure and accept every prefix seen in recorded logs: `dmesg` (`[  219.470994] `),
`dmesg -T`, `dmesg --time-format iso`, syslog/journal (`Dec  2 11:38:47 host kernel: `) and bare
lines. The reader runs `dmesg --time-format iso` (plain `dmesg` where that option is unknown) with a
timeout and says None where the log is not readable (no permission, no dmesg).

Evidence is only what was logged inside a window (`since_window`): an Xid from last week is not a
reason to evict a node today. A line whose time cannot be read (a log printed without timestamps)
is kept: the reader's own output always has them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

import psutil

from stalwart.health.records import Finding, Severity
from stalwart.processes import spawn, stop_process
from stalwart.store.records import Record


@dataclass(frozen=True)
class XidInfo:
    name: str
    severity: Severity
    machine_fault: bool
    failure_class: str | None = None


# From NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors). machine_fault marks the ones that
# mean this GPU (or its links) is bad or needs a reset, whatever the application does: the node is
# evicted at once. Application-caused Xids (13, 31, 43) are reported, never blamed on the machine.
XID_CATALOG: dict[int, XidInfo] = {
    13: XidInfo("Graphics Engine Exception", Severity.WARNING, False),
    31: XidInfo("GPU memory page fault", Severity.WARNING, False),
    43: XidInfo("GPU stopped processing", Severity.WARNING, False),
    45: XidInfo("Preemptive cleanup, due to previous errors", Severity.INFO, False),
    48: XidInfo("Double Bit ECC Error", Severity.CRITICAL, True, "ecc_error"),
    61: XidInfo("Internal micro-controller breakpoint/warning", Severity.WARNING, False),
    62: XidInfo("Internal micro-controller halt", Severity.CRITICAL, True, "xid"),
    63: XidInfo("ECC page retirement or row remapping recording event", Severity.WARNING, False),
    64: XidInfo("ECC page retirement or row remapper recording failure", Severity.CRITICAL, True, "ecc_error"),
    74: XidInfo("NVLink Error", Severity.CRITICAL, True, "xid"),
    79: XidInfo("GPU has fallen off the bus", Severity.CRITICAL, True, "xid"),
    92: XidInfo("High single-bit ECC error rate", Severity.WARNING, False),
    94: XidInfo("Contained ECC error", Severity.ERROR, False, "ecc_error"),
    95: XidInfo("Uncontained ECC error", Severity.CRITICAL, True, "ecc_error"),
    109: XidInfo("Context Switch Timeout Error", Severity.WARNING, False),
    119: XidInfo("GSP RPC Timeout", Severity.CRITICAL, True, "xid"),
    120: XidInfo("GSP Error", Severity.CRITICAL, True, "xid"),
    140: XidInfo("Unrecovered ECC Error", Severity.CRITICAL, True, "ecc_error"),
    154: XidInfo("GPU Recovery Action Changed", Severity.CRITICAL, True, "xid"),
}

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)[^)]*\): (?P<xid>\d+)"
    r"(?:, pid=(?P<pid>'<unknown>'|<unknown>|\d+))?(?:, name=(?P<name>[^,]*))?,?\s*(?P<msg>.*)$"
)
_FALLEN_OFF = re.compile(r"NVRM: (?:GPU (?:at )?(?P<pci>[0-9A-Fa-f:.]+):? )?.*fallen off the bus", re.IGNORECASE)
_INIT_FAILED = re.compile(r"NVRM: GPU (?P<pci>[0-9A-Fa-f:.]+): RmInitAdapter failed")
_OOM_KILL = re.compile(
    r"(?P<cgroup>Memory cgroup )?[Oo]ut of memory: Kill(?:ed)? process (?P<pid>\d+) "
    r"\((?P<name>.*?)\)(?:\s+total-vm|,|\s*$)"
)
_PANIC = re.compile(r"Kernel panic - not syncing: (?P<reason>.*)$")
_SOFT_LOCKUP = re.compile(r"BUG: soft lockup - CPU#(?P<cpu>\d+) stuck")
_ISO_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:[,.](\d+))?([+-]\d\d:?\d\d|Z)?")
_BOOT_TIME = re.compile(r"^(?:\S+\s+\S+\s+\S+\s+\S+\s+kernel:\s*|kernel:\s*)?\[\s*(\d+\.\d+)\]")
_CTIME = re.compile(r"^\[(\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4})\]")
_SYSLOG_TIME = re.compile(r"^(\w{3} [ \d]\d \d\d:\d\d:\d\d) \S+ kernel:")
_PREFIX = re.compile(r"^(?:\S+\s+\S+\s+\S+\s+\S+\s+kernel:\s*|kernel:\s*)?(?:\[[^\]]*\]\s*)*")


class XidEvent(Record):
    xid: int
    pci: str | None = None
    pid: int | None = None
    process: str | None = None
    message: str = ""
    name: str = "unknown Xid"
    severity: Severity = Severity.WARNING
    machine_fault: bool = False
    failure_class: str | None = None
    line: str = ""


class OomKill(Record):
    pid: int
    process: str
    cgroup: bool  # a memory cgroup (container limit) kill rather than the whole host running out
    line: str


class KernelLogScan(Record):
    xids: list[XidEvent] = []
    fallen_off_bus: list[str] = []  # "fallen off the bus" lines, also printed without an Xid by new drivers
    init_failures: list[str] = []  # the driver could not initialise a GPU (RmInitAdapter failed)
    oom_kills: list[OomKill] = []
    panics: list[str] = []
    soft_lockups: list[str] = []


def strip_prefix(line: str) -> str:
    """The message without its dmesg/syslog timestamp and host prefix."""
    return _PREFIX.sub("", line.rstrip("\n"), count=1).strip()


def line_time(line: str, boot_time: float, now: float) -> float | None:
    """When a kernel log line was logged (epoch seconds), from whichever timestamp it carries; None
    where it has none. `boot_time` turns dmesg's seconds-since-boot into a time; `now` gives a
    syslog line (which has no year) the latest year that does not put it in the future. Local time
    where the line names no zone, as dmesg -T and syslog print it."""
    if m := _ISO_TIME.match(line):
        zone = m.group(3) or ""
        text = m.group(1) + "." + (m.group(2) or "0")[:6] + ("+00:00" if zone in ("", "Z") else zone)
        stamp = datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z")
        return stamp.timestamp() if zone else stamp.replace(tzinfo=None).timestamp()
    if m := _CTIME.match(line):
        return datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y").timestamp()
    if m := _SYSLOG_TIME.match(line):
        year = datetime.fromtimestamp(now).year
        for y in (year, year - 1):
            t = datetime.strptime(f"{y} {m.group(1)}", "%Y %b %d %H:%M:%S").timestamp()
            if t <= now + 60:  # a minute of clock skew between the log and this reader
                return t
        return None
    if m := _BOOT_TIME.match(line):
        return boot_time + float(m.group(1))
    return None


def since_window(lines: Iterable[str], since: float, *, boot_time: float, now: float | None = None) -> list[str]:
    """The lines logged at or after `since` (epoch seconds). A continuation line (no timestamp of its
    own, as a multi-line driver message prints them) goes with the line before it; a log with no
    timestamps at all is kept whole."""
    now = time.time() if now is None else now
    kept: list[str] = []
    keep_undated = True  # until a dated line says otherwise
    for line in lines:
        t = line_time(line, boot_time, now)
        if t is not None:
            keep_undated = t >= since
        if keep_undated:
            kept.append(line)
    return kept


def parse_xid_line(line: str) -> XidEvent | None:
    m = _XID.search(line)
    if m is None:
        return None
    xid = int(m.group("xid"))
    info = XID_CATALOG.get(xid)
    pid = m.group("pid")
    message = m.group("msg").strip()
    machine_fault = info.machine_fault if info else False
    severity = info.severity if info else Severity.WARNING
    if xid == 154 and "(None)" in message.split(" to ")[-1]:
        machine_fault, severity = False, Severity.INFO  # the recovery action went back to None
    return XidEvent(
        xid=xid,
        pci=m.group("pci").upper(),
        pid=int(pid) if pid and pid.isdigit() else None,
        process=None if (m.group("name") or "").strip("' ") in ("", "<unknown>") else m.group("name").strip(),
        message=message,
        name=info.name if info else "unknown Xid",
        severity=severity,
        machine_fault=machine_fault,
        failure_class=info.failure_class if info else None,
        line=strip_prefix(line),
    )


def scan_kernel_log(lines: Iterable[str]) -> KernelLogScan:
    scan = KernelLogScan()
    for raw in lines:
        line = raw.rstrip("\n")
        if "NVRM" in line:
            xid = parse_xid_line(line)
            if xid is not None:
                scan.xids.append(xid)
            elif _FALLEN_OFF.search(line):
                scan.fallen_off_bus.append(strip_prefix(line))
            elif _INIT_FAILED.search(line):
                scan.init_failures.append(strip_prefix(line))
            continue
        m = _OOM_KILL.search(line)
        if m:
            scan.oom_kills.append(
                OomKill(
                    pid=int(m.group("pid")),
                    process=m.group("name"),
                    cgroup=bool(m.group("cgroup")),
                    line=strip_prefix(line),
                )
            )
            continue
        if _PANIC.search(line):
            scan.panics.append(strip_prefix(line))
        elif _SOFT_LOCKUP.search(line):
            scan.soft_lockups.append(strip_prefix(line))
    return scan


def xid_findings(scan: KernelLogScan) -> list[Finding]:
    """GPU findings from the kernel log: one per (GPU, Xid), the first line as evidence."""
    seen: dict[tuple[str | None, int], Finding] = {}
    for x in scan.xids:
        key = (x.pci, x.xid)
        if key in seen:
            if len(seen[key].evidence) < 3:
                seen[key].evidence.append(x.line)
            continue
        seen[key] = Finding(
            code=f"xid_{x.xid}",
            severity=x.severity,
            message=f"Xid {x.xid} ({x.name}) on GPU {x.pci}",
            subject=x.pci,
            machine_fault=x.machine_fault,
            failure_class=x.failure_class if x.machine_fault else None,
            evidence=[x.line],
        )
    findings = list(seen.values())
    if scan.fallen_off_bus and not any(x.xid == 79 for x in scan.xids):
        findings.append(
            Finding(
                code="gpu_fallen_off_bus",
                severity=Severity.CRITICAL,
                message="a GPU has fallen off the bus",
                machine_fault=True,
                failure_class="xid",
                evidence=scan.fallen_off_bus[:3],
            )
        )
    failed = sorted({m.group("pci") for ln in scan.init_failures if (m := _INIT_FAILED.search(ln))})
    for pci in failed:
        findings.append(
            Finding(
                code="gpu_init_failed",
                severity=Severity.CRITICAL,
                subject=pci,
                message=f"the driver cannot initialise GPU {pci}",
                machine_fault=True,
                failure_class="gpu_lost",
                evidence=[ln for ln in scan.init_failures if pci in ln][:2],
            )
        )
    return findings


def host_kernel_findings(scan: KernelLogScan) -> list[Finding]:
    findings: list[Finding] = []
    for k in scan.oom_kills:
        findings.append(
            Finding(
                code="oom_kill",
                severity=Severity.WARNING,
                message=f"the {'cgroup ' if k.cgroup else ''}OOM killer killed {k.process} (pid {k.pid})",
                subject=str(k.pid),
                evidence=[k.line],
            )
        )
    if scan.panics:
        findings.append(
            Finding(
                code="kernel_panic",
                severity=Severity.CRITICAL,
                message="the kernel panicked",
                machine_fault=True,
                failure_class="kernel_panic",
                evidence=scan.panics[:3],
            )
        )
    if scan.soft_lockups:
        findings.append(
            Finding(
                code="soft_lockup",
                severity=Severity.WARNING,
                message="a CPU soft lockup",
                evidence=scan.soft_lockups[:3],
            )
        )
    return findings


def read_kernel_log(timeout: float = 5.0, max_lines: int = 20_000, binary: str = "dmesg") -> list[str] | None:
    """The last `max_lines` kernel log lines via `dmesg --time-format iso` (each line dated with its
    zone, so a window needs no boot time), plain `dmesg` where that fails; None where neither can
    read it."""
    path = shutil.which(binary)
    if path is None:
        return None
    for args in (["--time-format", "iso"], []):
        lines = _run_dmesg([path, *args], timeout)
        if lines is not None:
            return lines[-max_lines:]
    return None


def _run_dmesg(argv: list[str], timeout: float) -> list[str] | None:
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc, grace=1.0)
        return None
    if proc.returncode != 0:
        return None  # typically "Operation not permitted" (kernel.dmesg_restrict), or an old dmesg
    return out.decode(errors="replace").splitlines()


class WindowedKernelLog:
    """A kernel log reader that keeps only what was logged in the window: since `started_at` (the
    agent's start), or the last `minutes` when they are given."""

    def __init__(
        self,
        started_at: float,
        minutes: int | None = None,
        reader: Callable[[], list[str] | None] = read_kernel_log,
        boot_time: Callable[[], float] = psutil.boot_time,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.started_at, self.minutes = started_at, minutes
        self.reader, self.boot_time, self.clock = reader, boot_time, clock

    def since(self) -> float:
        return self.clock() - self.minutes * 60 if self.minutes is not None else self.started_at

    def __call__(self) -> list[str] | None:
        lines = self.reader()
        if lines is None:
            return None
        return since_window(lines, self.since(), boot_time=self.boot_time(), now=self.clock())

    def describe(self) -> str:
        return f"the last {self.minutes} minutes" if self.minutes is not None else "since the agent started"
