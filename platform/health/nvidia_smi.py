"""`nvidia-smi -q`: a pure parser of its text output, and a thin reader that runs it.

The text is an indented tree of `Key : Value` lines (a key may also have children, as
"HW Slowdown" does). Field names moved between driver releases ("Clocks Throttle Reasons" became
"Clocks Event Reasons"; V100 reports ECC as Single/Double Bit, A100 and later as SRAM/DRAM
Correctable/Uncorrectable), so lookups accept every spelling seen in recorded outputs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from stalwart.health.gpu_readings import GpuReading
from stalwart.processes import spawn, stop_process
from stalwart.store.records import Record

_KEY_VALUE = re.compile(r"^(?P<key>\S.*?)\s+:\s?(?P<value>.*)$")
_NO_HANDLE = re.compile(r"Unable to determine the device handle for GPU\s*(?P<bus>[0-9A-Fa-f:.]+):\s*(?P<err>.*)")
_DRIVER_DOWN = "couldn't communicate with the NVIDIA driver"


class NvidiaSmiReport(Record):
    driver_version: str | None = None
    cuda_version: str | None = None
    attached_gpus: int | None = None
    gpus: list[GpuReading] = []
    errors: list[str] = []  # lines where nvidia-smi said it could not reach a GPU or the driver
    driver_unreachable: bool = False


@dataclass
class _Node:
    value: str | None = None
    children: dict[str, _Node] = field(default_factory=dict)

    def get(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for part in path:
            if node is None:
                return None
            node = node.children.get(part.lower())
        return node

    def value_at(self, *path: str) -> str | None:
        node = self.get(*path)
        return node.value if node is not None else None

    def first(self, *paths: tuple[str, ...]) -> _Node | None:
        for p in paths:
            node = self.get(*p)
            if node is not None:
                return node
        return None


def _tree(lines: Iterable[str]) -> _Node:
    root = _Node()
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for raw in lines:
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith("=") or stripped == "[...]":
            continue
        indent = len(line) - len(line.lstrip(" "))
        m = _KEY_VALUE.match(stripped)
        key, value = (m.group("key").strip(), m.group("value").strip()) if m else (stripped, None)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else root
        node = _Node(value=value)
        parent.children.setdefault(key.lower(), node)  # duplicates (several processes): keep the first
        stack.append((indent, node))
    return root


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value)
    return float(m.group(1)) if m else None


def _int(value: str | None) -> int | None:
    n = _number(value)
    return int(n) if n is not None else None


def _flag(value: str | None) -> bool | None:
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("yes", "enabled", "active", "true"):
        return True
    if v in ("no", "disabled", "not active", "false"):
        return False
    return None


def _snake(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _active_reasons(node: _Node | None) -> list[str]:
    out: list[str] = []
    if node is None:
        return out
    for key, child in node.children.items():
        if _flag(child.value):
            out.append(_snake(key))
        out.extend(_active_reasons(child))
    return out


def _ecc_counts(section: _Node | None) -> tuple[int | None, int | None]:
    """(corrected, uncorrected) from either the SRAM/DRAM layout or the Single/Double Bit layout."""
    if section is None:
        return None, None
    if section.get("single bit") is not None or section.get("double bit") is not None:
        return _int(section.value_at("single bit", "total")), _int(section.value_at("double bit", "total"))
    corrected: int | None = None
    uncorrected: int | None = None
    for key, child in section.children.items():
        n = _int(child.value)
        if n is None:
            continue
        if "uncorrectable" in key:
            uncorrected = (uncorrected or 0) + n
        elif "correctable" in key:
            corrected = (corrected or 0) + n
    return corrected, uncorrected


def _thresholds(temp: _Node | None) -> tuple[float | None, float | None]:
    """(slowdown, shutdown) temperatures in C. Older drivers print them ("GPU Slowdown Temp"); driver
    580 prints margins instead: "GPU T.Limit Temp" is how far the GPU is below its limit, and
    "GPU Slowdown/Shutdown T.Limit Temp" where each threshold lies below that limit (negative: above
    it). On an H100 at 35 C: margin 52, slowdown -2, shutdown -8, so 89 and 95 C, which is what NVML
    reports there (docs/gpu.md)."""
    if temp is None:
        return None, None
    slowdown, shutdown = _number(temp.value_at("gpu slowdown temp")), _number(temp.value_at("gpu shutdown temp"))
    current, margin = _number(temp.value_at("gpu current temp")), _number(temp.value_at("gpu t.limit temp"))
    if current is not None and margin is not None:
        limit = current + margin
        below_slowdown = _number(temp.value_at("gpu slowdown t.limit temp"))
        below_shutdown = _number(temp.value_at("gpu shutdown t.limit temp"))
        if slowdown is None and below_slowdown is not None:
            slowdown = limit - below_slowdown
        if shutdown is None and below_shutdown is not None:
            shutdown = limit - below_shutdown
    return slowdown, shutdown


def _gpu(index: int, bus_id: str, node: _Node) -> GpuReading:
    temp = node.get("temperature")
    slowdown_temperature, shutdown_temperature = _thresholds(temp)
    link = node.get("pci", "gpu link info")
    ecc = node.get("ecc errors")
    pages = node.get("retired pages")
    rows = node.get("remapped rows")
    pending_pages = None
    if pages is not None:
        pending_pages = next((_flag(c.value) for k, c in pages.children.items() if k.startswith("pending")), None)
    vol_c, vol_u = _ecc_counts(ecc.get("volatile") if ecc else None)
    agg_c, agg_u = _ecc_counts(ecc.get("aggregate") if ecc else None)
    throttle = node.first(("clocks event reasons",), ("clocks throttle reasons",))
    power = node.first(("gpu power readings",), ("power readings",))
    power_draw = None
    if power is not None:
        power_draw = _number(
            power.value_at("power draw")
            or power.value_at("instantaneous power draw")
            or power.value_at("average power draw")
        )
    return GpuReading(
        index=index,
        name=node.value_at("product name"),
        uuid=node.value_at("gpu uuid"),
        bus_id=bus_id,
        temperature_c=_number(temp.value_at("gpu current temp")) if temp else None,
        slowdown_temperature_c=slowdown_temperature,
        shutdown_temperature_c=shutdown_temperature,
        memory_temperature_c=_number(temp.value_at("memory current temp")) if temp else None,
        power_draw_w=power_draw,
        utilization_gpu_pct=_number(node.value_at("utilization", "gpu")),
        memory_used_mib=_number(node.value_at("fb memory usage", "used")),
        memory_total_mib=_number(node.value_at("fb memory usage", "total")),
        sm_clock_mhz=_number(node.value_at("clocks", "sm")),
        sm_clock_max_mhz=_number(node.value_at("max clocks", "sm")),
        memory_clock_mhz=_number(node.value_at("clocks", "memory")),
        throttle_reasons=_active_reasons(throttle),
        pcie_gen_current=_int(link.value_at("pcie generation", "current")) if link else None,
        pcie_gen_max=_int(link.value_at("pcie generation", "max")) if link else None,
        pcie_width_current=_int(link.value_at("link width", "current")) if link else None,
        pcie_width_max=_int(link.value_at("link width", "max")) if link else None,
        pcie_replay_count=_int(node.value_at("pci", "replays since reset")),
        ecc_enabled=_flag(node.value_at("ecc mode", "current")),
        ecc_volatile_corrected=vol_c,
        ecc_volatile_uncorrected=vol_u,
        ecc_aggregate_corrected=agg_c,
        ecc_aggregate_uncorrected=agg_u,
        retired_pages_single_bit=_int(pages.value_at("single bit ecc")) if pages else None,
        retired_pages_double_bit=_int(pages.value_at("double bit ecc")) if pages else None,
        retired_pages_pending=pending_pages,
        remapped_rows_correctable=_int(rows.value_at("correctable error")) if rows else None,
        remapped_rows_uncorrectable=_int(rows.value_at("uncorrectable error")) if rows else None,
        remapped_rows_pending=_flag(rows.value_at("pending")) if rows else None,
        remapped_rows_failure=_flag(rows.value_at("remapping failure occurred")) if rows else None,
    )


def parse_nvidia_smi_q(text: str) -> NvidiaSmiReport:
    """Parse the text of `nvidia-smi -q` (any subset of its sections, several GPUs)."""
    lines = text.splitlines()
    errors = [ln.strip() for ln in lines if _NO_HANDLE.search(ln) or _DRIVER_DOWN in ln]
    root = _tree(ln for ln in lines if not _NO_HANDLE.search(ln))
    gpus: list[GpuReading] = []
    for key, node in root.children.items():
        if key.startswith("gpu ") and node.value is None:
            gpus.append(_gpu(len(gpus), key[4:].strip().upper(), node))
    for ln in lines:
        m = _NO_HANDLE.search(ln)
        if m:
            gpus.append(
                GpuReading(
                    index=len(gpus),
                    bus_id=m.group("bus").rstrip(":").upper(),
                    responding=False,
                    error=m.group("err").strip() or "no device handle",
                )
            )
    return NvidiaSmiReport(
        driver_version=root.value_at("driver version"),
        cuda_version=root.value_at("cuda version"),
        attached_gpus=_int(root.value_at("attached gpus")),
        gpus=gpus,
        errors=errors,
        driver_unreachable=any(_DRIVER_DOWN in e for e in errors),
    )


def run_nvidia_smi(timeout: float = 20.0, binary: str = "nvidia-smi", args: Sequence[str] = ("-q",)) -> str | None:
    """The text of `nvidia-smi -q` (or of `args`), or None where nvidia-smi is not installed.

    A hung driver makes nvidia-smi hang, so it is bounded by `timeout` and stopped after it; a
    timeout raises TimeoutError, which is itself a health signal the caller reports.
    """
    path = shutil.which(binary)
    if path is None:
        return None
    proc = spawn([path, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_process(proc, grace=1.0)
        raise TimeoutError(f"nvidia-smi {' '.join(args)} did not answer within {timeout:.0f}s") from None
    return out.decode(errors="replace")
