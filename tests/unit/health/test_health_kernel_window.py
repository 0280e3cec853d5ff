"""Kernel-log evidence counts only inside its window: a week-old Xid does not evict a node today."""

from __future__ import annotations

from datetime import UTC, datetime

from support.paths import REPO

from stalwart.health.gpu_probe import GpuProbe
from stalwart.health.host import HostProbe
from stalwart.health.kernel_log import WindowedKernelLog, line_time, read_kernel_log, since_window
from stalwart.health.records import ProbeStatus

KLOG = REPO / "tests" / "data" / "health" / "kernel-log"
RECORDED = (KLOG / "xid-week-old-and-fresh.log").read_text().splitlines()  # Xid 79 on 11-21, Xid 48 on 11-28


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def gpu_probe(window: WindowedKernelLog) -> GpuProbe:
    return GpuProbe(kernel_log_reader=window)


def window(*, started: str, now: str, minutes: int | None = None) -> WindowedKernelLog:
    return WindowedKernelLog(
        at(started), minutes, reader=lambda: RECORDED, boot_time=lambda: 0.0, clock=lambda: at(now)
    )


def test_a_week_old_xid_does_not_evict_since_the_agent_started() -> None:
    # The agent started after the Xid 79 of a week ago and before the fresh Xid 48.
    seen = window(started="2026-11-28T11:00:00", now="2026-11-28T12:00:00")()
    assert seen is not None and all("Xid (PCI:0000:91:00): 79" not in line for line in seen)
    result = gpu_probe(window(started="2026-11-28T11:00:00", now="2026-11-28T12:00:00")).run()
    codes = {f.code for f in result.findings}
    assert "xid_79" not in codes and "gpu_fallen_off_bus" not in codes
    assert result.machine_fault and "xid_48" in codes  # the fresh one evicts


def test_only_the_old_xid_leaves_the_node_unblamed() -> None:
    # The agent started after both: nothing in the log is this run's evidence.
    result = gpu_probe(window(started="2026-11-28T11:40:00", now="2026-11-28T12:00:00")).run()
    assert not result.machine_fault and result.findings == []
    assert result.status in (ProbeStatus.NOT_AVAILABLE, ProbeStatus.OK)  # no GPU here: not available


def test_the_last_n_minutes_window() -> None:
    # 30 minutes back from 12:00 reaches 11:30: the Xid 48 at 11:38 is in, the week-old Xid 79 out.
    recent = gpu_probe(window(started="2026-11-28T11:59:00", now="2026-11-28T12:00:00", minutes=30)).run()
    assert {f.code for f in recent.findings} == {"xid_48"} and recent.machine_fault
    # Ten days back: both count, as the whole log did before windows.
    wide = gpu_probe(window(started="2026-11-28T11:59:00", now="2026-11-28T12:00:00", minutes=14_400)).run()
    assert {"xid_79", "xid_48"} <= {f.code for f in wide.findings}


def test_dmesg_seconds_since_boot_are_dated_by_the_boot_time() -> None:
    lines = (KLOG / "gpud-xid79-sxid.log").read_text().splitlines()  # [6781741.548768] ...: 78 days after boot
    boot = at("2026-09-10T00:00:00")
    xid_at = boot + 6781741.548779
    assert line_time(lines[2], boot, xid_at) == xid_at
    assert since_window(lines, xid_at + 3600, boot_time=boot, now=xid_at + 7200) == []
    assert since_window(lines, xid_at - 3600, boot_time=boot, now=xid_at) == lines


def test_every_recorded_timestamp_format_is_read() -> None:
    now = at("2026-11-28T12:00:00")
    iso = (KLOG / "oom-equinor-ert-7797.log").read_text().splitlines()[0]
    assert line_time(iso, 0.0, now) == datetime.fromisoformat("2024-04-29T14:55:41.678628+02:00").timestamp()
    ctime = (KLOG / "gpud-xid13-31-109.log").read_text().splitlines()[0]
    assert line_time(ctime, 0.0, now) == datetime(2024, 8, 30, 11, 11, 22).timestamp()  # local time, as dmesg -T
    syslog = (KLOG / "gpu-operator-1146-xid48-xid64.log").read_text().splitlines()[0]
    assert line_time(syslog, 0.0, now) == datetime(2025, 12, 2, 11, 38, 27).timestamp()  # no year: the last Dec 2
    bare = (KLOG / "ml-engineering-xid63.log").read_text().splitlines()[0]
    assert line_time(bare, 0.0, now) is None


def test_continuation_lines_go_with_their_dated_line() -> None:
    lines = (KLOG / "nvsentinel-155-fallen-off-no-xid.log").read_text().splitlines()  # [ 1843.308145] + 2 undated
    assert since_window(lines, 2000.0, boot_time=0.0, now=3000.0) == []
    assert since_window(lines, 1000.0, boot_time=0.0, now=3000.0) == lines


def test_the_host_probe_reads_the_same_window() -> None:
    panic = (KLOG / "panic-linux-speakup-1.log").read_text().splitlines()  # [ 267.9...] seconds after boot
    old = WindowedKernelLog(1000.0, reader=lambda: panic, boot_time=lambda: 0.0, clock=lambda: 2000.0)
    assert "kernel_panic" not in {f.code for f in HostProbe(kernel_log_reader=old).run().findings}
    fresh = WindowedKernelLog(100.0, reader=lambda: panic, boot_time=lambda: 0.0, clock=lambda: 2000.0)
    assert "kernel_panic" in {f.code for f in HostProbe(kernel_log_reader=fresh).run().findings}


def test_the_real_reader_dates_every_line_it_reads() -> None:
    lines = read_kernel_log()
    if lines is None:  # dmesg_restrict, or no dmesg: the probes say the log is not readable
        return
    undated = [line for line in lines if line_time(line, 0.0, at("2100-01-01T00:00:00")) is None]
    assert all(line[:1].isspace() for line in undated), undated[:3]  # continuation lines of a message
