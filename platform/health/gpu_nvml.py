"""NVML (through nvidia-ml-py, imported as `pynvml`): a thin reader of GPU readings and Xid events.

Everything here is reading; judging the readings is `gpu_health`. Where the package, the library
or the driver is missing, `read_nvml` says why in `NvmlUnavailable` and the probe reports
"not available": nothing here ever makes up a reading.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from stalwart.health.gpu_readings import GpuReading
from stalwart.health.kernel_log import XID_CATALOG, XidEvent
from stalwart.health.records import Severity
from stalwart.store.records import Record

# nvmlClocksThrottleReason* bits, named as nvidia-smi names them (snake_case).
THROTTLE_BITS: dict[int, str] = {
    0x1: "idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class NvmlUnavailable(Record):
    reason: str


class NvmlSnapshot(Record):
    driver_version: str | None = None
    gpus: list[GpuReading] = []


def throttle_reason_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


def _nvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


def _handle_key(handle: Any) -> Any:
    """A device handle as a dict key: the address it holds. (pynvml's handles are ctypes pointers to
    an opaque struct; the struct itself is unhashable, and two handles of one GPU are two objects.)"""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    """A reading, or None where this GPU or driver does not support it."""
    nv = _nvml()
    try:
        return fn(*args)
    except nv.NVMLError_NotSupported:
        return None
    except nv.NVMLError as exc:
        if isinstance(exc, (nv.NVMLError_GpuIsLost, nv.NVMLError_Unknown)):
            raise
        return None


def _read_device(index: int) -> GpuReading:
    nv = _nvml()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)
        name = _text(nv.nvmlDeviceGetName(h))
    except nv.NVMLError as exc:
        return GpuReading(index=index, responding=False, error=f"{type(exc).__name__}: {exc}")
    try:
        pci = _try(nv.nvmlDeviceGetPciInfo, h)
        mem = _try(nv.nvmlDeviceGetMemoryInfo, h)
        util = _try(nv.nvmlDeviceGetUtilizationRates, h)
        power_mw = _try(nv.nvmlDeviceGetPowerUsage, h)
        reasons_fn = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        reasons = _try(reasons_fn, h)
        ecc_mode = _try(nv.nvmlDeviceGetEccMode, h)
        remapped = _try(nv.nvmlDeviceGetRemappedRows, h)
        sbe_pages = _try(nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        dbe_pages = _try(nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending_pages = _try(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        uuid = _try(nv.nvmlDeviceGetUUID, h)

        def ecc(kind: int, counter: int) -> int | None:
            v = _try(nv.nvmlDeviceGetTotalEccErrors, h, kind, counter)
            return int(v) if v is not None else None

        return GpuReading(
            index=index,
            name=name,
            uuid=_text(uuid) if uuid is not None else None,
            bus_id=_text(pci.busId) if pci is not None else None,
            temperature_c=_try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
            slowdown_temperature_c=_try(
                nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            shutdown_temperature_c=_try(
                nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
            ),
            power_draw_w=power_mw / 1000.0 if power_mw is not None else None,
            utilization_gpu_pct=float(util.gpu) if util is not None else None,
            memory_used_mib=mem.used / 2**20 if mem is not None else None,
            memory_total_mib=mem.total / 2**20 if mem is not None else None,
            sm_clock_mhz=_try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
            sm_clock_max_mhz=_try(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
            memory_clock_mhz=_try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
            throttle_reasons=throttle_reason_names(int(reasons)) if reasons is not None else [],
            pcie_gen_current=_try(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
            pcie_gen_max=_try(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
            pcie_width_current=_try(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
            pcie_width_max=_try(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
            pcie_replay_count=_try(nv.nvmlDeviceGetPcieReplayCounter, h),
            ecc_enabled=bool(ecc_mode[0]) if ecc_mode is not None else None,
            ecc_volatile_corrected=ecc(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
            ecc_volatile_uncorrected=ecc(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
            ecc_aggregate_corrected=ecc(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
            ecc_aggregate_uncorrected=ecc(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC),
            retired_pages_single_bit=len(sbe_pages) if sbe_pages is not None else None,
            retired_pages_double_bit=len(dbe_pages) if dbe_pages is not None else None,
            retired_pages_pending=bool(pending_pages) if pending_pages is not None else None,
            remapped_rows_correctable=remapped[0] if remapped is not None else None,
            remapped_rows_uncorrectable=remapped[1] if remapped is not None else None,
            remapped_rows_pending=bool(remapped[2]) if remapped is not None else None,
            remapped_rows_failure=bool(remapped[3]) if remapped is not None else None,
        )
    except nv.NVMLError as exc:  # lost in the middle of the reading
        return GpuReading(index=index, name=name, responding=False, error=f"{type(exc).__name__}: {exc}")


def read_nvml() -> NvmlSnapshot | NvmlUnavailable:
    """Every GPU's readings, or why NVML cannot be used on this machine."""
    try:
        nv = _nvml()
    except ImportError:
        return NvmlUnavailable(reason="the nvidia-ml-py package (import name pynvml) is not installed")
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        return NvmlUnavailable(reason=f"NVML cannot start: {exc} (no NVIDIA driver or library on this machine)")
    try:
        driver = _try(nv.nvmlSystemGetDriverVersion)
        count = nv.nvmlDeviceGetCount()
        return NvmlSnapshot(
            driver_version=_text(driver) if driver else None, gpus=[_read_device(i) for i in range(count)]
        )
    except nv.NVMLError as exc:
        return NvmlUnavailable(reason=f"NVML failed to list GPUs: {exc}")
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass


class NvmlXidWatcher:
    """Xid events as NVML delivers them (critical Xids only), polled with a bounded wait.

    `open()` returns False with `reason` set where NVML is not available; `poll` then returns [].
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self._set: Any = None
        self._bus_ids: dict[Any, str] = {}

    def open(self) -> bool:
        try:
            nv = _nvml()
            nv.nvmlInit()
        except ImportError:
            self.reason = "the nvidia-ml-py package is not installed"
            return False
        except Exception as exc:  # NVMLError: no library, no driver
            self.reason = f"NVML cannot start: {exc}"
            return False
        self._set = nv.nvmlEventSetCreate()
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._set)
                pci = _try(nv.nvmlDeviceGetPciInfo, h)
                self._bus_ids[_handle_key(h)] = _text(pci.busId) if pci else str(i)
            except nv.NVMLError as exc:
                self.reason = f"GPU {i} cannot deliver Xid events: {exc}"
        return True

    def poll(self, timeout_ms: int = 0, max_events: int = 64) -> list[XidEvent]:
        if self._set is None:
            return []
        nv = _nvml()
        events: list[XidEvent] = []
        for _ in range(max_events):  # bounded
            try:
                data = nv.nvmlEventSetWait_v2(self._set, timeout_ms if not events else 0)
            except nv.NVMLError_Timeout:
                break
            xid = int(data.eventData)
            info = XID_CATALOG.get(xid)
            events.append(
                XidEvent(
                    xid=xid,
                    pci=self._bus_ids.get(_handle_key(data.device)),
                    message="reported by NVML",
                    name=info.name if info else "unknown Xid",
                    severity=info.severity if info else Severity.WARNING,
                    machine_fault=info.machine_fault if info else False,
                    failure_class=info.failure_class if info else None,
                )
            )
        return events

    def close(self) -> None:
        if self._set is None:
            return
        nv = _nvml()
        try:
            nv.nvmlEventSetFree(self._set)
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
        self._set = None
