"""The host probe: CPU, memory, disk space, mounts, and OOM kills and panics from the kernel log.

These are read with psutil on the real machine; `evaluate_host` is pure so limits are tested on
constructed readings (a disk this machine cannot fill) as well as on this machine's own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import psutil

from stalwart.health.kernel_log import KernelLogScan, host_kernel_findings, read_kernel_log, scan_kernel_log
from stalwart.health.records import Finding, ProbeResult, Reading, Severity
from stalwart.store.records import Record

PROBE = "host"
DISK_FULL_PERCENT = 98.0
DISK_LOW_PERCENT = 90.0
DISK_MIN_FREE_BYTES = 1 << 30
MEMORY_HIGH_PERCENT = 95.0


class DiskReading(Record):
    path: str
    total_bytes: int
    free_bytes: int
    percent: float


class MountReading(Record):
    mountpoint: str
    device: str
    fstype: str
    read_only: bool


class HostReadings(Record):
    cpu_count: int
    cpu_percent: float
    load_1m: float
    memory_total_bytes: int
    memory_available_bytes: int
    memory_percent: float
    disks: list[DiskReading] = []
    missing_paths: list[str] = []
    mounts: list[MountReading] = []


def read_host(paths: Sequence[str] = ("/",), cpu_interval: float = 0.1) -> HostReadings:
    disks: list[DiskReading] = []
    missing: list[str] = []
    for p in paths:
        try:
            u = psutil.disk_usage(p)
        except (FileNotFoundError, PermissionError):
            missing.append(p)
            continue
        disks.append(DiskReading(path=p, total_bytes=u.total, free_bytes=u.free, percent=u.percent))
    mem = psutil.virtual_memory()
    mounts = [
        MountReading(mountpoint=m.mountpoint, device=m.device, fstype=m.fstype, read_only="ro" in m.opts.split(","))
        for m in psutil.disk_partitions(all=True)
    ]
    return HostReadings(
        cpu_count=os.cpu_count() or 1,
        cpu_percent=psutil.cpu_percent(interval=cpu_interval),
        load_1m=os.getloadavg()[0],
        memory_total_bytes=mem.total,
        memory_available_bytes=mem.available,
        memory_percent=mem.percent,
        disks=disks,
        missing_paths=missing,
        mounts=mounts,
    )


def _mount_of(path: str, mounts: Sequence[MountReading]) -> MountReading | None:
    """The mount holding `path`: the longest mountpoint that is a prefix of it."""
    path = os.path.abspath(path)
    best: MountReading | None = None
    for m in mounts:
        mp = m.mountpoint.rstrip("/") or "/"
        if (path == mp or path.startswith(mp + "/") or mp == "/") and (
            best is None or len(mp) > len(best.mountpoint.rstrip("/") or "/")
        ):
            best = m
    return best


def evaluate_host(
    readings: HostReadings,
    kernel_log: KernelLogScan | None = None,
    *,
    writable_paths: Sequence[str] = (),
) -> ProbeResult:
    """Disk full (machine fault), disk low, memory pressure, missing or read-only paths, kernel log."""
    findings: list[Finding] = []
    for d in readings.disks:
        if d.percent >= DISK_FULL_PERCENT or d.free_bytes < DISK_MIN_FREE_BYTES:
            findings.append(
                Finding(
                    code="disk_full",
                    severity=Severity.CRITICAL,
                    subject=d.path,
                    machine_fault=True,
                    failure_class="disk_full",
                    message=f"{d.path} is full: {d.percent:.1f}% used, {d.free_bytes / 2**30:.2f} GiB free",
                )
            )
        elif d.percent >= DISK_LOW_PERCENT:
            findings.append(
                Finding(
                    code="disk_low",
                    severity=Severity.WARNING,
                    subject=d.path,
                    message=f"{d.path} is {d.percent:.1f}% used",
                )
            )
    for p in readings.missing_paths:
        findings.append(
            Finding(
                code="path_missing",
                severity=Severity.CRITICAL,
                subject=p,
                machine_fault=True,
                failure_class="mount_missing",
                message=f"{p} does not exist on this node",
            )
        )
    for p in writable_paths:
        m = _mount_of(p, readings.mounts)
        if m is not None and m.read_only:
            findings.append(
                Finding(
                    code="mount_read_only",
                    severity=Severity.CRITICAL,
                    subject=p,
                    machine_fault=True,
                    failure_class="mount_read_only",
                    message=f"{p} is on a read-only mount ({m.mountpoint}, {m.fstype})",
                )
            )
    if readings.memory_percent >= MEMORY_HIGH_PERCENT:
        findings.append(
            Finding(
                code="memory_pressure", severity=Severity.WARNING, message=f"memory {readings.memory_percent:.1f}% used"
            )
        )
    if kernel_log is not None:
        findings.extend(host_kernel_findings(kernel_log))
    summary: dict[str, Reading] = {
        "cpu_count": readings.cpu_count,
        "cpu_percent": readings.cpu_percent,
        "load_1m": readings.load_1m,
        "memory_percent": readings.memory_percent,
        "memory_available_bytes": readings.memory_available_bytes,
        "kernel_log_readable": kernel_log is not None,
    }
    for d in readings.disks:
        summary[f"disk_used_percent:{d.path}"] = d.percent
    return ProbeResult.from_findings(PROBE, findings, summary)


class HostProbe:
    name = PROBE

    def __init__(
        self,
        paths: Sequence[str] = ("/",),
        writable_paths: Sequence[str] = (),
        kernel_log_reader: Callable[[], list[str] | None] = read_kernel_log,
    ) -> None:
        self.paths = list(dict.fromkeys([*paths, *writable_paths]))
        self.writable_paths = list(writable_paths)
        self.kernel_log_reader = kernel_log_reader

    def run(self) -> ProbeResult:
        lines = self.kernel_log_reader()
        scan = scan_kernel_log(lines) if lines is not None else None
        return evaluate_host(read_host(self.paths), scan, writable_paths=self.writable_paths)
