"""GPU probe: the `nvidia-smi -q` parser on recorded real outputs, the evaluation, and honest absence."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.paths import REPO

from stalwart.health.gpu_health import evaluate_gpus
from stalwart.health.gpu_nvml import NvmlSnapshot, NvmlUnavailable, NvmlXidWatcher, read_nvml, throttle_reason_names
from stalwart.health.gpu_probe import GpuProbe
from stalwart.health.kernel_log import scan_kernel_log
from stalwart.health.nvidia_smi import parse_nvidia_smi_q
from stalwart.health.records import ProbeResult, ProbeStatus

SMI = REPO / "tests" / "data" / "health" / "nvidia-smi"
KLOG = REPO / "tests" / "data" / "health" / "kernel-log"


def smi(name: str) -> str:
    return (SMI / name).read_text()


def codes(result: ProbeResult) -> set[str]:
    return {f.code for f in result.findings}


def test_a_healthy_a100_is_parsed_field_by_field() -> None:
    report = parse_nvidia_smi_q(smi("a100-sxm4-80gb-healthy.txt"))
    assert (report.driver_version, report.cuda_version, report.attached_gpus) == ("525.60.13", "12.0", 8)
    [g] = report.gpus
    assert g.name == "NVIDIA A100-SXM4-80GB" and g.bus_id == "00000000:07:00.0"
    assert g.uuid == "GPU-eb0003d2-77b4-70fd-4ab9-3ef1c9853c49"
    assert (g.temperature_c, g.slowdown_temperature_c, g.shutdown_temperature_c) == (28, 89, 92)
    assert (g.sm_clock_mhz, g.sm_clock_max_mhz, g.power_draw_w) == (1155, 1410, 67.97)
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (4, 4, 16, 16)
    assert g.ecc_enabled is True and g.ecc_volatile_uncorrected == 0 and g.ecc_aggregate_corrected == 0
    assert g.retired_pages_single_bit is None  # "N/A" on an A100: absent, not zero
    assert (g.remapped_rows_pending, g.remapped_rows_failure) == (False, False)
    assert g.throttle_reasons == []
    assert (g.memory_used_mib, g.memory_total_mib) == (22377, 81920)

    result = evaluate_gpus(report.gpus)
    assert result.status is ProbeStatus.OK and not result.machine_fault


def test_several_gpus_and_the_idle_throttle_reason() -> None:
    report = parse_nvidia_smi_q(smi("a100-sxm4-40gb-two-of-eight.txt"))
    assert [g.bus_id for g in report.gpus] == ["00000001:00:00.0", "00000002:00:00.0"]
    assert [g.temperature_c for g in report.gpus] == [41, 40]
    assert all(g.throttle_reasons == ["idle"] for g in report.gpus)
    assert evaluate_gpus(report.gpus).status is ProbeStatus.OK


def test_fewer_gpus_than_expected_is_a_machine_fault() -> None:
    report = parse_nvidia_smi_q(smi("a100-sxm4-40gb-two-of-eight.txt"))  # trimmed to 2 of its 8 GPUs
    result = evaluate_gpus(report.gpus, expected_count=report.attached_gpus)
    assert result.status is ProbeStatus.FAILED and result.machine_fault
    assert result.failure_class == "gpu_lost" and "gpu_missing" in codes(result)


def test_ecc_errors_and_a_pending_row_remap_degrade_without_evicting() -> None:
    [g] = parse_nvidia_smi_q(smi("a100-sxm4-80gb-remap-pending.txt")).gpus
    assert (g.ecc_volatile_corrected, g.ecc_volatile_uncorrected) == (177, 0)
    assert (g.remapped_rows_correctable, g.remapped_rows_pending, g.remapped_rows_failure) == (1, True, False)
    result = evaluate_gpus([g])
    assert result.status is ProbeStatus.DEGRADED and not result.machine_fault
    assert codes(result) == {"row_remap_pending"}


def test_pages_pending_retirement_degrade() -> None:
    # The recorded excerpt has no GPU header line; the parser reads sections under one.
    text = "GPU 00000000:00:00.0\n" + smi("retired-pages-pending.txt")
    [g] = parse_nvidia_smi_q(text).gpus
    assert (g.retired_pages_single_bit, g.retired_pages_double_bit, g.retired_pages_pending) == (2, 0, True)
    assert codes(evaluate_gpus([g])) == {"retired_pages_pending"}


def test_a_gpu_without_a_device_handle_is_lost() -> None:
    report = parse_nvidia_smi_q(smi("gpu-lost-no-handle.txt"))
    [g] = report.gpus
    assert not g.responding and g.bus_id == "0000:03:00.0" and g.error == "Unknown Error"
    result = evaluate_gpus(report.gpus)
    assert result.machine_fault and result.failure_class == "gpu_lost"


def test_machine_faults_in_readings() -> None:
    [healthy] = parse_nvidia_smi_q(smi("a100-sxm4-80gb-healthy.txt")).gpus
    cases = {
        "ecc_uncorrectable": {"ecc_volatile_uncorrected": 2},
        "row_remap_failure": {"remapped_rows_failure": True},
        "retired_pages_limit": {"retired_pages_double_bit": 60},
    }
    for code, change in cases.items():
        result = evaluate_gpus([healthy.model_copy(update=change)])
        assert result.machine_fault and result.failure_class == "ecc_error", code
        assert code in codes(result)


def test_degradations_in_readings() -> None:
    [healthy] = parse_nvidia_smi_q(smi("a100-sxm4-80gb-healthy.txt")).gpus
    cases = {
        "pcie_link_narrow": {"pcie_width_current": 8},
        "gpu_clock_slowdown": {"throttle_reasons": ["hw_slowdown", "hw_thermal_slowdown"]},
        "gpu_too_hot": {"temperature_c": 90.0},
    }
    for code, change in cases.items():
        result = evaluate_gpus([healthy.model_copy(update=change)])
        assert result.status is ProbeStatus.DEGRADED and not result.machine_fault, code
        assert code in codes(result)
    slow_link = evaluate_gpus([healthy.model_copy(update={"pcie_gen_current": 1})])
    assert slow_link.status is ProbeStatus.OK and "pcie_link_slow" in codes(slow_link)  # idle GPUs do this


def test_throttle_reason_bits() -> None:
    assert throttle_reason_names(0x0) == []
    assert throttle_reason_names(0x48) == ["hw_slowdown", "hw_thermal_slowdown"]


def test_without_nvml_the_probe_says_not_available() -> None:
    snapshot = read_nvml()
    if isinstance(snapshot, NvmlSnapshot):  # a machine with a GPU driver: readings, not absence
        assert all(g.index == i for i, g in enumerate(snapshot.gpus))
        return
    assert isinstance(snapshot, NvmlUnavailable) and "NVML" in snapshot.reason
    result = GpuProbe(kernel_log_reader=lambda: []).run()
    assert result.status is ProbeStatus.NOT_AVAILABLE and not result.machine_fault
    assert result.findings == [] and "NVML" in (result.reason or "")
    watcher = NvmlXidWatcher()
    assert watcher.open() is False and watcher.reason
    assert watcher.poll(timeout_ms=10) == []
    watcher.close()


def test_an_xid_79_in_the_kernel_log_fails_the_gpu_probe_even_without_a_driver() -> None:
    lines = (KLOG / "gpud-xid79-sxid.log").read_text().splitlines()
    result = GpuProbe(kernel_log_reader=lambda: lines).run()
    assert result.status is ProbeStatus.FAILED and result.machine_fault and result.failure_class == "xid"
    assert "xid_79" in codes(result)
    assert ProbeResult.loads(result.dumps()) == result  # a record: survives JSON


def test_xid_findings_join_nvml_readings() -> None:
    [healthy] = parse_nvidia_smi_q(smi("a100-sxm4-80gb-healthy.txt")).gpus
    scan = scan_kernel_log(Path(KLOG / "gpu-operator-1146-xid48-xid64.log").read_text().splitlines())
    result = evaluate_gpus([healthy], kernel_log=scan)
    assert result.machine_fault and result.failure_class == "ecc_error"
    assert {"xid_48", "xid_64", "gpu_init_failed"} <= codes(result)


def test_a_healthy_h100_with_driver_580_is_parsed() -> None:
    """Recorded on an H100 80GB HBM3 (driver 580.159.04, CUDA 13.0) that Stalwart's probe ran on (docs/gpu.md)."""
    report = parse_nvidia_smi_q(smi("h100-80gb-hbm3-driver-580.txt"))
    assert (report.driver_version, report.cuda_version, report.attached_gpus, report.errors) == (
        "580.159.04",
        "13.0",
        1,
        [],
    )
    [g] = report.gpus
    assert (g.name, g.bus_id, g.uuid) == (
        "NVIDIA H100 80GB HBM3",
        "00000000:00:06.0",
        "GPU-3ecd459c-0b85-7603-9390-03076bf3f151",
    )
    assert (g.temperature_c, g.memory_temperature_c, g.power_draw_w) == (35, 36, 72.92)  # instantaneous draw
    # Printed as margins to the T.Limit (52, -2, -8): NVML reported 89 and 95 C on this model and driver.
    assert (g.slowdown_temperature_c, g.shutdown_temperature_c) == (89, 95)
    assert (g.sm_clock_mhz, g.sm_clock_max_mhz, g.memory_clock_mhz) == (345, 1980, 2619)
    assert (g.memory_used_mib, g.memory_total_mib, g.utilization_gpu_pct) == (0, 81559, 0)
    assert g.throttle_reasons == ["idle"]  # "Clocks Event Reasons", the newer name
    assert (g.pcie_gen_current, g.pcie_gen_max, g.pcie_width_current, g.pcie_width_max) == (5, 5, 16, 16)
    assert g.pcie_replay_count == 1
    assert g.ecc_enabled is True
    assert (g.ecc_volatile_corrected, g.ecc_volatile_uncorrected) == (0, 0)  # SRAM parity + SEC-DED + DRAM
    assert (g.ecc_aggregate_corrected, g.ecc_aggregate_uncorrected) == (0, 0)
    assert (g.retired_pages_single_bit, g.retired_pages_pending) == (None, None)  # N/A: H100 remaps rows
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable) == (0, 0)
    assert (g.remapped_rows_pending, g.remapped_rows_failure) == (False, False)
    result = evaluate_gpus(report.gpus, expected_count=1, source="nvidia-smi")
    assert result.status is ProbeStatus.OK and result.findings == []
    hot = evaluate_gpus([g.model_copy(update={"temperature_c": 90.0})])
    assert hot.status is ProbeStatus.DEGRADED and codes(hot) == {"gpu_too_hot"}  # read only from the margins


def test_the_xid_watcher_maps_nvml_handles_to_bus_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """pynvml's device handles are ctypes pointers to an opaque struct, which cannot be a dict key:
    on an H100, open() raised "unhashable type" (docs/gpu.md). pynvml's own types here, no driver."""
    import ctypes

    import pynvml

    from stalwart.health import gpu_nvml

    def handle(i: int) -> object:  # a new pointer object per call, as pynvml returns
        return ctypes.cast(ctypes.c_void_p(0x1000 * (i + 1)), pynvml.c_nvmlDevice_t)

    bus_ids = {0x1000: b"00000000:18:00.0", 0x2000: b"00000000:2A:00.0"}
    events = [79]

    class FakeNvml:
        NVMLError = pynvml.NVMLError
        NVMLError_NotSupported = pynvml.NVMLError_NotSupported
        NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
        NVMLError_Unknown = pynvml.NVMLError_Unknown
        NVMLError_Timeout = pynvml.NVMLError_Timeout
        nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

        def nvmlInit(self) -> None: ...
        def nvmlShutdown(self) -> None: ...
        def nvmlEventSetCreate(self) -> object:
            return object()

        def nvmlEventSetFree(self, event_set: object) -> None: ...
        def nvmlDeviceGetCount(self) -> int:
            return 2

        def nvmlDeviceGetHandleByIndex(self, i: int) -> object:
            return handle(i)

        def nvmlDeviceRegisterEvents(self, h: object, types: int, event_set: object) -> None: ...
        def nvmlDeviceGetPciInfo(self, h: object) -> object:
            info = pynvml.nvmlPciInfo_t()
            info.busId = bus_ids[ctypes.cast(h, ctypes.c_void_p).value or 0]
            return info

        def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> object:
            if not events:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            data = pynvml.c_nvmlEventData_t()
            data.device, data.eventData = handle(1), events.pop()
            return data

    monkeypatch.setattr(gpu_nvml, "_nvml", FakeNvml)
    watcher = NvmlXidWatcher()
    assert watcher.open() is True and watcher.reason is None
    [event] = watcher.poll(timeout_ms=10)
    assert (event.xid, event.pci, event.machine_fault) == (79, "00000000:2A:00.0", True)
    assert watcher.poll(timeout_ms=10) == []
    watcher.close()
