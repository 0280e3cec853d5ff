"""How fast this machine is, and how busy it was: printed by `make test`'s runner so that timings
from different days can be compared.

The same suite took 7 min 50 s on one day and 14 min 39 s on another on machines of the same
kind: the host's CPUs are shared, and the hypervisor takes some of their time
(`steal` in /proc/stat). A fixed piece of pure-Python work before the run says how fast a core is
then; the cores' accounting over the run says how much of them the suite had.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
PROBE_ITERATIONS = 20_000_000  # 0.7 s to 1.3 s on a 2-core machine, as busy as it is
# Fields of /proc/stat's "cpu" line (clock ticks): user nice system idle iowait irq softirq steal.
BUSY_FIELDS = (0, 1, 2, 5, 6)
IDLE_FIELDS = (3, 4)
STEAL_FIELD = 7


def probe_seconds(iterations: int = PROBE_ITERATIONS) -> float:
    """Wall seconds for a fixed loop of additions: lower is a faster (or less shared) core."""
    started = time.perf_counter()
    total = 0
    for i in range(iterations):
        total += i
    return time.perf_counter() - started


@dataclass(frozen=True)
class CpuTimes:
    """The machine's cores in seconds since boot, summed over cores."""

    busy: float
    idle: float
    steal: float

    @classmethod
    def parse(cls, text: str, ticks_per_second: int | None = None) -> CpuTimes:
        ticks_per_second = ticks_per_second or os.sysconf("SC_CLK_TCK")
        fields = [int(x) for x in text.splitlines()[0].split()[1:]]
        fields += [0] * (STEAL_FIELD + 1 - len(fields))

        def total(indices: tuple[int, ...]) -> float:
            return sum(fields[i] for i in indices) / ticks_per_second

        return cls(busy=total(BUSY_FIELDS), idle=total(IDLE_FIELDS), steal=fields[STEAL_FIELD] / ticks_per_second)

    @classmethod
    def now(cls) -> CpuTimes | None:
        try:
            return cls.parse(PROC_STAT.read_text())
        except (OSError, ValueError, IndexError):
            return None  # not Linux, or no /proc: the suite runs without the reading

    def since(self, before: CpuTimes) -> CpuTimes:
        return CpuTimes(self.busy - before.busy, self.idle - before.idle, self.steal - before.steal)

    def describe(self) -> str:
        """For a delta: CPU-seconds used, and the share of the cores' time that was busy and stolen."""
        whole = self.busy + self.idle + self.steal
        if whole <= 0:
            return "no CPU time elapsed"
        return (
            f"{self.busy:,.0f} CPU-seconds, the cores {100 * self.busy / whole:.0f}% busy, "
            f"{100 * self.steal / whole:.0f}% taken by the host ({self.steal:,.0f} s of steal)"
        )
