"""Host and network probes: real readings of this machine, sysfs fixture trees, recorded ibstat."""

from __future__ import annotations

import shutil
from pathlib import Path

from support.paths import REPO

from stalwart.health.host import DiskReading, HostProbe, MountReading, evaluate_host, read_host
from stalwart.health.kernel_log import scan_kernel_log
from stalwart.health.network import (
    NetworkProbe,
    error_deltas,
    evaluate_network,
    parse_ib_state,
    parse_ibstat,
    parse_ibstatus,
    read_net_sysfs,
)
from stalwart.health.probes import default_probes, run_probes
from stalwart.health.records import ProbeResult, ProbeStatus

DATA = REPO / "tests" / "data" / "health"


def codes(result: ProbeResult) -> set[str]:
    return {f.code for f in result.findings}


# -- host -------------------------------------------------------------------------------------
def test_this_machine_reads_as_a_healthy_host() -> None:
    readings = read_host(["/"])
    assert readings.cpu_count >= 1 and readings.memory_total_bytes > 0
    assert [d.path for d in readings.disks] == ["/"] and any(m.mountpoint == "/" for m in readings.mounts)
    result = HostProbe(kernel_log_reader=lambda: None).run()
    assert result.status in (ProbeStatus.OK, ProbeStatus.DEGRADED)  # a busy CI disk may be "low", not "full"
    assert result.readings["kernel_log_readable"] is False


def test_a_full_disk_is_a_machine_fault() -> None:
    readings = read_host(["/"]).model_copy(
        update={
            "disks": [
                DiskReading(path="/ckpt", total_bytes=100 << 30, free_bytes=1 << 29, percent=99.5),
            ]
        }
    )
    result = evaluate_host(readings)
    assert result.status is ProbeStatus.FAILED and result.machine_fault and result.failure_class == "disk_full"
    low = readings.model_copy(
        update={"disks": [DiskReading(path="/d", total_bytes=100 << 30, free_bytes=8 << 30, percent=92.0)]}
    )
    assert codes(evaluate_host(low)) == {"disk_low"} and not evaluate_host(low).machine_fault


def test_missing_and_read_only_paths(tmp_path: Path) -> None:
    missing = read_host(["/", str(tmp_path / "not-mounted")])
    result = evaluate_host(missing)
    assert "path_missing" in codes(result) and result.failure_class == "mount_missing"
    ro = missing.model_copy(
        update={
            "missing_paths": [],
            "mounts": [
                MountReading(mountpoint="/", device="rootfs", fstype="ext4", read_only=False),
                MountReading(mountpoint="/ckpt", device="nfs:/x", fstype="nfs4", read_only=True),
            ],
        }
    )
    result = evaluate_host(ro, writable_paths=["/ckpt/job-1", "/tmp"])
    assert [f.subject for f in result.findings if f.code == "mount_read_only"] == ["/ckpt/job-1"]


def test_kernel_log_findings_on_the_host() -> None:
    lines = (DATA / "kernel-log" / "oom-equinor-ert-7797.log").read_text().splitlines()
    result = HostProbe(kernel_log_reader=lambda: lines).run()
    assert "oom_kill" in codes(result) and not result.machine_fault
    panic = scan_kernel_log((DATA / "kernel-log" / "panic-linux-speakup-1.log").read_text().splitlines())
    assert evaluate_host(read_host(["/"]), panic).failure_class == "kernel_panic"


# -- network ----------------------------------------------------------------------------------
def test_a_healthy_sysfs_tree() -> None:
    readings = read_net_sysfs(DATA / "sysfs" / "healthy")
    assert [n.name for n in readings.nics] == ["eth0", "lo"]
    [port] = readings.ib_ports
    assert (port.device, port.port, port.state, port.state_code, port.phys_state) == (
        "mlx5_ib0",
        1,
        "ACTIVE",
        4,
        "LinkUp",
    )
    assert port.rate == "200 Gb/sec (4X HDR)" and port.counters["symbol_error"] == 0
    result = evaluate_network(readings, required_nics=["eth0"])
    assert result.status is ProbeStatus.OK and result.readings["ib_ports_active"] == 1


def test_an_infiniband_port_down_is_a_machine_fault() -> None:
    result = evaluate_network(read_net_sysfs(DATA / "sysfs" / "ib-port-down"))
    assert result.status is ProbeStatus.FAILED and result.machine_fault and result.failure_class == "ib_port_down"
    by_code = {f.code: f for f in result.findings}
    assert by_code["ib_port_down"].subject == "mlx4_0 port 1"
    assert by_code["ib_port_disabled"].subject == "mlx4_0 port 2" and not by_code["ib_port_disabled"].machine_fault
    assert by_code["nic_not_up"].subject == "ib0"  # not required: info only
    required = evaluate_network(read_net_sysfs(DATA / "sysfs" / "ib-port-down"), required_nics=["ib0", "eth9"])
    assert {f.subject for f in required.findings if f.code in ("nic_down", "nic_missing")} == {"ib0", "eth9"}


def test_counters_that_move_between_runs_degrade(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(DATA / "sysfs" / "healthy", root)
    probe = NetworkProbe(sysfs_root=root, required_nics=["eth0"])
    assert probe.run().status is ProbeStatus.OK
    counters = root / "class" / "infiniband" / "mlx5_ib0" / "ports" / "1" / "counters"
    (counters / "symbol_error").write_text("17\n")
    (counters / "link_downed").write_text("1\n")
    eth = root / "class" / "net" / "eth0"
    (eth / "statistics" / "rx_errors").write_text("5\n")
    (eth / "carrier_changes").write_text(str(int((eth / "carrier_changes").read_text()) + 2) + "\n")
    result = probe.run()
    assert result.status is ProbeStatus.DEGRADED and not result.machine_fault
    subjects = {f.subject: f.code for f in result.findings}
    assert subjects == {
        "mlx5_ib0/1:symbol_error": "link_errors",
        "mlx5_ib0/1:link_downed": "link_flap",
        "eth0:rx_errors": "link_errors",
        "eth0:carrier_changes": "link_flap",
    }
    assert result.readings["error_counter_delta"] == 17 + 1 + 5 + 2
    assert probe.run().status is ProbeStatus.OK  # deltas are per run


def test_recorded_ibstat_and_ibstatus_outputs() -> None:
    ports = parse_ibstat((DATA / "ibstat" / "linux-rdma-mlx4-port-down.txt").read_text())
    assert [(p.device, p.port, p.state, p.phys_state, p.link_layer) for p in ports] == [
        ("mlx4_0", 1, "DOWN", "Polling", "InfiniBand"),
        ("mlx4_0", 2, "DOWN", "Disabled", "Ethernet"),
    ]
    active = parse_ibstatus((DATA / "ibstat" / "azhpc-ibstatus-active.txt").read_text())
    assert [(p.device, p.state_code, p.state, p.phys_state, p.rate) for p in active] == [
        ("mlx5_an0", 4, "ACTIVE", "LinkUp", "40 Gb/sec (4X QDR)"),
        ("mlx5_ib0", 4, "ACTIVE", "LinkUp", "200 Gb/sec (4X HDR)"),
    ]
    assert parse_ib_state("1: DOWN") == (1, "DOWN") and parse_ib_state("ACTIVE") == (None, "ACTIVE")


def test_this_machines_network_and_a_missing_tree(tmp_path: Path) -> None:
    result = NetworkProbe().run()
    assert result.status is not ProbeStatus.NOT_AVAILABLE
    assert NetworkProbe(sysfs_root=tmp_path).run().status is ProbeStatus.NOT_AVAILABLE
    assert error_deltas(read_net_sysfs("/sys"), None) == {}


# -- running probes ---------------------------------------------------------------------------
class Exploding:
    name = "exploding"

    def run(self) -> ProbeResult:
        raise RuntimeError("boom")


def test_a_crashing_probe_is_not_available_never_healthy() -> None:
    [result] = run_probes([Exploding()])
    assert result.status is ProbeStatus.NOT_AVAILABLE and "boom" in (result.reason or "")
    assert [p.name for p in default_probes()] == ["gpu", "nvlink", "host", "network"]
