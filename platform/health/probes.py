"""Running probes: one interface, and a runner that turns a crashing probe into "not available".

A probe that raises has a bug or met something unexpected; that says nothing about the machine, so
it is reported as not available with the error, never as healthy and never as a fault.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from stalwart.health.gpu_nvml import NvmlUnavailable
from stalwart.health.gpu_probe import GpuProbe
from stalwart.health.host import HostProbe
from stalwart.health.kernel_log import WindowedKernelLog, read_kernel_log
from stalwart.health.network import NetworkProbe
from stalwart.health.node_expectations import NodeExpectations
from stalwart.health.nvlink import NvlinkProbe
from stalwart.health.recorded import RecordedOutputs
from stalwart.health.records import ProbeResult


class Probe(Protocol):
    name: str

    def run(self) -> ProbeResult: ...


def run_probes(probes: Iterable[Probe]) -> list[ProbeResult]:
    results: list[ProbeResult] = []
    for probe in probes:
        try:
            results.append(probe.run())
        except Exception as exc:
            results.append(ProbeResult.not_available(probe.name, f"probe error: {type(exc).__name__}: {exc}"))
    return results


def default_probes(
    *,
    expected_gpus: int | None = None,
    disk_paths: Iterable[str] = ("/",),
    writable_paths: Iterable[str] = (),
    required_nics: Iterable[str] = (),
    sysfs_root: str = "/sys",
    kernel_log_reader: Callable[[], list[str] | None] = read_kernel_log,
    recorded: RecordedOutputs | None = None,
) -> list[Probe]:
    """The probe set: GPU, NVLink, host and network. `recorded`: outputs that stand for the
    machine's (stalwart.health.recorded), for the readers it names."""
    gpu = GpuProbe(expected_count=expected_gpus, kernel_log_reader=kernel_log_reader)
    if recorded is not None and recorded.nvidia_smi_q is not None:
        gpu.nvml_reader = lambda: NvmlUnavailable(reason=f"recorded output {recorded.nvidia_smi_q} stands for NVML")
        gpu.nvidia_smi_reader = recorded.read_nvidia_smi_q
    if recorded is not None and recorded.sysfs_root is not None:
        sysfs_root = str(recorded.sysfs_root)
    return [
        gpu,
        NvlinkProbe(),
        HostProbe(paths=list(disk_paths), writable_paths=list(writable_paths), kernel_log_reader=kernel_log_reader),
        NetworkProbe(sysfs_root=sysfs_root, required_nics=list(required_nics)),
    ]


def node_probes(
    expected: NodeExpectations, started_at: float, sysfs_root: str = "/sys", recorded: RecordedOutputs | None = None
) -> list[Probe]:
    """The node agent's probes, told what the job's spec expects of the node, reading the kernel
    log only in the spec's window (since `started_at`, the agent's start, by default)."""
    return default_probes(
        expected_gpus=expected.expected_gpus,
        disk_paths=expected.watched_disks,
        writable_paths=expected.writable_paths,
        required_nics=expected.required_nics,
        sysfs_root=sysfs_root,
        kernel_log_reader=WindowedKernelLog(
            started_at,
            expected.kernel_log_window_minutes,
            reader=recorded.read_kernel_log if recorded is not None and recorded.kernel_log else read_kernel_log,
        ),
        recorded=recorded,
    )
