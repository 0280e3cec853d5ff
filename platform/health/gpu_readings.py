"""One GPU's raw readings, whichever reader produced them (NVML or `nvidia-smi -q`).

Every field may be None: a reading the driver does not support (retired pages on an A100, row
remapping on a V100) is absent, not zero.
"""

from __future__ import annotations

from stalwart.store.records import Record


class GpuReading(Record):
    index: int
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    responding: bool = True  # False: the driver lists the GPU but cannot talk to it
    error: str | None = None  # why it is not responding, in the reader's words

    temperature_c: float | None = None
    slowdown_temperature_c: float | None = None
    shutdown_temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_draw_w: float | None = None
    utilization_gpu_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None

    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    memory_clock_mhz: float | None = None
    throttle_reasons: list[str] = []  # active clock throttle (event) reasons, snake_case

    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    pcie_replay_count: int | None = None

    ecc_enabled: bool | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_corrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None

    retired_pages_single_bit: int | None = None
    retired_pages_double_bit: int | None = None
    retired_pages_pending: bool | None = None

    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
