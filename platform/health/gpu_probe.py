"""The GPU probe: NVML first, `nvidia-smi -q` as the fallback reader, Xids from the kernel log.

On a machine with neither NVML nor nvidia-smi the result is NOT_AVAILABLE with the reason.
"""

from __future__ import annotations

from collections.abc import Callable

from stalwart.health.gpu_health import PROBE, evaluate_gpus
from stalwart.health.gpu_nvml import NvmlSnapshot, NvmlUnavailable, read_nvml
from stalwart.health.kernel_log import KernelLogScan, read_kernel_log, scan_kernel_log
from stalwart.health.nvidia_smi import parse_nvidia_smi_q, run_nvidia_smi
from stalwart.health.records import ProbeResult


class GpuProbe:
    name = PROBE

    def __init__(
        self,
        expected_count: int | None = None,
        kernel_log_reader: Callable[[], list[str] | None] = read_kernel_log,
        nvidia_smi_timeout: float = 20.0,
        nvml_reader: Callable[[], NvmlSnapshot | NvmlUnavailable] | None = None,
        nvidia_smi_reader: Callable[[], str | None] | None = None,
    ) -> None:
        """The readers default to the machine's NVML and `nvidia-smi -q`; tests give recorded ones."""
        self.expected_count = expected_count
        self.kernel_log_reader = kernel_log_reader
        self.nvidia_smi_timeout = nvidia_smi_timeout
        self.nvml_reader = nvml_reader
        self.nvidia_smi_reader = nvidia_smi_reader

    def run(self) -> ProbeResult:
        lines = self.kernel_log_reader()
        kernel = scan_kernel_log(lines) if lines is not None else None
        snapshot = (self.nvml_reader or read_nvml)()
        if not isinstance(snapshot, NvmlUnavailable):
            return evaluate_gpus(snapshot.gpus, expected_count=self.expected_count, kernel_log=kernel, source="nvml")
        try:
            text = (
                self.nvidia_smi_reader() if self.nvidia_smi_reader else run_nvidia_smi(timeout=self.nvidia_smi_timeout)
            )
        except TimeoutError as exc:
            return _unreadable(f"{snapshot.reason}; {exc}", kernel)
        if text is None:
            return _unreadable(f"{snapshot.reason}; nvidia-smi is not installed", kernel)
        report = parse_nvidia_smi_q(text)
        if report.driver_unreachable:
            return _unreadable(f"{snapshot.reason}; nvidia-smi: {report.errors[0]}", kernel)
        return evaluate_gpus(report.gpus, expected_count=self.expected_count, kernel_log=kernel, source="nvidia-smi")


def _unreadable(reason: str, kernel: KernelLogScan | None) -> ProbeResult:
    """No reader works. Not available, unless the kernel log already tells of a GPU fault."""
    if kernel is not None and (kernel.xids or kernel.fallen_off_bus or kernel.init_failures):
        result = evaluate_gpus([], kernel_log=kernel, source="kernel-log")
        result.reason = "; ".join(r for r in (result.reason, f"GPUs unreadable: {reason}") if r)
        return result
    return ProbeResult.not_available(PROBE, reason)
