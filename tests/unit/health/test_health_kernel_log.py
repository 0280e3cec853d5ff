"""Kernel-log parsers on recorded real lines: Xids, GPUs off the bus, OOM kills, panics."""

from __future__ import annotations

from support.paths import REPO

from stalwart.health.kernel_log import (
    host_kernel_findings,
    parse_xid_line,
    read_kernel_log,
    scan_kernel_log,
    strip_prefix,
    xid_findings,
)
from stalwart.health.records import Severity

KLOG = REPO / "tests" / "data" / "health" / "kernel-log"


def scan(name: str):  # type: ignore[no-untyped-def]
    return scan_kernel_log((KLOG / name).read_text().splitlines())


def test_xid_79_from_dmesg_is_a_machine_fault() -> None:
    s = scan("gpud-xid79-sxid.log")
    [x] = s.xids
    assert (x.xid, x.pci, x.pid, x.process) == (79, "0000:91:00", None, None)
    assert x.machine_fault and x.severity is Severity.CRITICAL and x.failure_class == "xid"
    assert x.line.startswith("NVRM: Xid (PCI:0000:91:00): 79")
    assert s.fallen_off_bus == ["NVRM: GPU 0000:91:00.0: GPU has fallen off the bus."]
    [f] = xid_findings(s)  # the Xid and its "fallen off" line are one finding
    assert f.code == "xid_79" and f.machine_fault


def test_fallen_off_the_bus_without_an_xid() -> None:
    s = scan("nvsentinel-155-fallen-off-no-xid.log")
    assert s.xids == [] and len(s.fallen_off_bus) == 1
    [f] = xid_findings(s)
    assert f.code == "gpu_fallen_off_bus" and f.machine_fault and f.failure_class == "xid"


def test_double_bit_ecc_and_retirement_failure_from_syslog() -> None:
    s = scan("gpu-operator-1146-xid48-xid64.log")
    assert [(x.xid, x.pci, x.machine_fault, x.failure_class) for x in s.xids] == [
        (48, "0000:07:00", True, "ecc_error"),
        (64, "0000:07:00", True, "ecc_error"),
    ]
    assert "An uncorrectable double bit error (DBE)" in s.xids[0].message
    found = {f.code: f for f in xid_findings(s)}
    assert found["gpu_init_failed"].subject == "0000:0a:00.0" and found["gpu_init_failed"].machine_fault


def test_application_xids_are_not_blamed_on_the_machine() -> None:
    s = scan("gpud-xid13-31-109.log")
    assert [x.xid for x in s.xids] == [13, 13, 13, 109, 31, 109]
    assert not any(x.machine_fault for x in s.xids)
    assert s.xids[3].pid == 1797828 and s.xids[3].process == "pt_main_thread"
    findings = xid_findings(s)
    assert sorted(f.code for f in findings) == ["xid_109", "xid_13", "xid_31"]  # one per (GPU, Xid)
    assert len(next(f for f in findings if f.code == "xid_13").evidence) == 3


def test_contained_and_uncontained_ecc() -> None:
    s = scan("driver-source-xid94-xid95.log")
    assert [(x.xid, x.machine_fault) for x in s.xids] == [(94, False), (94, False), (95, True)]
    assert s.xids[0].pci == "0000:01:00" and s.xids[0].pid == 7194  # the MIG-instance form parses too


def test_row_remap_event_and_cleanup_xids_are_warnings() -> None:
    [x63] = scan("ml-engineering-xid63.log").xids
    assert (x63.xid, x63.pci, x63.pid, x63.severity, x63.machine_fault) == (
        63,
        "0000:10:1C",
        1896,
        Severity.WARNING,
        False,
    )
    s45 = scan("open-gpu-kernel-modules-1150-xid45.log")
    assert {x.xid for x in s45.xids} == {45} and {x.process for x in s45.xids} == {"python3"}
    assert all(x.severity is Severity.INFO for x in s45.xids)


def test_oom_kills_in_two_log_formats() -> None:
    ert = scan("oom-equinor-ert-7797.log")
    assert [(k.pid, k.process, k.cgroup) for k in ert.oom_kills] == [(1440763, "perl", False)]
    docker = scan("oom-docker-for-linux-1001.log")
    assert [(k.pid, k.process) for k in docker.oom_kills] == [(15784, "python3"), (15925, "(resolved)")]
    findings = host_kernel_findings(docker)
    assert [f.code for f in findings] == ["oom_kill", "oom_kill"] and not any(f.machine_fault for f in findings)


def test_a_kernel_panic_is_a_machine_fault() -> None:
    s = scan("panic-linux-speakup-1.log")
    assert s.panics[0] == "Kernel panic - not syncing: Fatal exception in interrupt"
    [f] = host_kernel_findings(s)
    assert f.code == "kernel_panic" and f.machine_fault and f.failure_class == "kernel_panic"


def test_prefixes_are_stripped() -> None:
    assert strip_prefix("Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: x") == "NVRM: x"
    assert strip_prefix("[Fri Aug 30 11:43:09 2024] NVRM: x") == "NVRM: x"
    assert strip_prefix("kernel: NVRM: x") == "NVRM: x"
    assert strip_prefix("[ 130.456250] [ T1946] NVRM: x") == "NVRM: x"
    assert parse_xid_line("nothing to see") is None


def test_the_real_kernel_log_reads_or_says_it_cannot() -> None:
    lines = read_kernel_log(timeout=10)
    assert lines is None or isinstance(lines, list)
    if lines is not None:
        scan_kernel_log(lines)  # whatever this machine logged, the scan handles it
