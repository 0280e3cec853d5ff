"""Judging GPU readings: pure functions from `GpuReading`s (and kernel-log Xids) to a ProbeResult.

Machine faults (evict at once): a GPU missing or not responding, uncorrectable ECC errors since the
driver loaded, a row-remapping failure, too many retired pages, and the machine-fault Xids.
Degradations (slower, or needs a reset at the next restart): thermal or hardware clock slowdown, a
narrower PCIe link than the slot supports, pending page retirement or row remapping.
"""

from __future__ import annotations

from stalwart.health.gpu_readings import GpuReading
from stalwart.health.kernel_log import KernelLogScan, xid_findings
from stalwart.health.records import Finding, ProbeResult, Reading, Severity

PROBE = "gpu"
# NVIDIA's RMA guidance for dynamic page retirement: a GPU with this many retired pages is replaced.
RETIRED_PAGES_LIMIT = 60
SLOWDOWN_REASONS = frozenset({"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"})


def _subject(g: GpuReading) -> str:
    return f"gpu{g.index} {g.bus_id}" if g.bus_id else f"gpu{g.index}"


def _gpu_findings(g: GpuReading) -> list[Finding]:
    s = _subject(g)
    if not g.responding:
        return [
            Finding(
                code="gpu_not_responding",
                severity=Severity.CRITICAL,
                subject=s,
                machine_fault=True,
                failure_class="gpu_lost",
                message=f"{s} is not responding: {g.error or 'no reason given'}",
            )
        ]
    out: list[Finding] = []
    if g.ecc_volatile_uncorrected:
        out.append(
            Finding(
                code="ecc_uncorrectable",
                severity=Severity.CRITICAL,
                subject=s,
                machine_fault=True,
                failure_class="ecc_error",
                message=f"{s}: {g.ecc_volatile_uncorrected} uncorrectable ECC errors since the driver loaded",
            )
        )
    elif g.ecc_aggregate_uncorrected:
        out.append(
            Finding(
                code="ecc_uncorrectable_history",
                severity=Severity.INFO,
                subject=s,
                message=f"{s}: {g.ecc_aggregate_uncorrected} uncorrectable ECC errors in its lifetime",
            )
        )
    if g.remapped_rows_failure:
        out.append(
            Finding(
                code="row_remap_failure",
                severity=Severity.CRITICAL,
                subject=s,
                machine_fault=True,
                failure_class="ecc_error",
                message=f"{s}: row remapping failed (RMA criterion)",
            )
        )
    elif g.remapped_rows_pending:
        out.append(
            Finding(
                code="row_remap_pending",
                severity=Severity.WARNING,
                subject=s,
                message=f"{s}: a remapped row is pending: reset the GPU at the next restart",
            )
        )
    retired = (g.retired_pages_single_bit or 0) + (g.retired_pages_double_bit or 0)
    if retired >= RETIRED_PAGES_LIMIT:
        out.append(
            Finding(
                code="retired_pages_limit",
                severity=Severity.CRITICAL,
                subject=s,
                machine_fault=True,
                failure_class="ecc_error",
                message=f"{s}: {retired} retired pages (limit {RETIRED_PAGES_LIMIT})",
            )
        )
    if g.retired_pages_pending:
        out.append(
            Finding(
                code="retired_pages_pending",
                severity=Severity.WARNING,
                subject=s,
                message=f"{s}: pages are pending retirement: reset the GPU at the next restart",
            )
        )
    slow = sorted(SLOWDOWN_REASONS.intersection(g.throttle_reasons))
    if slow:
        out.append(
            Finding(
                code="gpu_clock_slowdown",
                severity=Severity.WARNING,
                subject=s,
                message=f"{s}: clocks slowed down ({', '.join(slow)})",
            )
        )
    if g.temperature_c is not None and g.slowdown_temperature_c and g.temperature_c >= g.slowdown_temperature_c:
        out.append(
            Finding(
                code="gpu_too_hot",
                severity=Severity.WARNING,
                subject=s,
                message=f"{s}: {g.temperature_c:.0f} C, at or above its slowdown temperature "
                f"{g.slowdown_temperature_c:.0f} C",
            )
        )
    if g.pcie_width_current and g.pcie_width_max and g.pcie_width_current < g.pcie_width_max:
        out.append(
            Finding(
                code="pcie_link_narrow",
                severity=Severity.WARNING,
                subject=s,
                message=f"{s}: PCIe link x{g.pcie_width_current} of x{g.pcie_width_max}",
            )
        )
    if g.pcie_gen_current and g.pcie_gen_max and g.pcie_gen_current < g.pcie_gen_max:
        # Idle GPUs lower their link speed to save power: worth noting, not a fault by itself.
        out.append(
            Finding(
                code="pcie_link_slow",
                severity=Severity.INFO,
                subject=s,
                message=f"{s}: PCIe gen {g.pcie_gen_current} of {g.pcie_gen_max}",
            )
        )
    return out


def summarize(gpus: list[GpuReading]) -> dict[str, Reading]:
    temps = [g.temperature_c for g in gpus if g.temperature_c is not None]
    utils = [g.utilization_gpu_pct for g in gpus if g.utilization_gpu_pct is not None]
    readings: dict[str, Reading] = {
        "gpu_count": len(gpus),
        "gpus_responding": sum(g.responding for g in gpus),
        "max_temperature_c": max(temps) if temps else None,
        "mean_utilization_pct": sum(utils) / len(utils) if utils else None,
        "ecc_volatile_uncorrected": sum(g.ecc_volatile_uncorrected or 0 for g in gpus),
        "ecc_volatile_corrected": sum(g.ecc_volatile_corrected or 0 for g in gpus),
    }
    for g in gpus:
        readings[f"gpu{g.index}_temperature_c"] = g.temperature_c
        readings[f"gpu{g.index}_utilization_pct"] = g.utilization_gpu_pct
    return readings


def evaluate_gpus(
    gpus: list[GpuReading],
    *,
    expected_count: int | None = None,
    kernel_log: KernelLogScan | None = None,
    source: str = "nvml",
) -> ProbeResult:
    findings: list[Finding] = []
    if expected_count is not None and len(gpus) < expected_count:
        findings.append(
            Finding(
                code="gpu_missing",
                severity=Severity.CRITICAL,
                machine_fault=True,
                failure_class="gpu_lost",
                message=f"{len(gpus)} GPUs visible, {expected_count} expected",
            )
        )
    for g in gpus:
        findings.extend(_gpu_findings(g))
    if kernel_log is not None:
        findings.extend(xid_findings(kernel_log))
    result = ProbeResult.from_findings(PROBE, findings, {**summarize(gpus), "source": source})
    return result
