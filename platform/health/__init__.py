"""Node health: probes of GPUs, host and network, collective and compute checks.

Each probe is a thin reader of raw readings plus a pure evaluation, so the evaluation is tested on
recorded real outputs and a machine without the hardware reports "not available" instead of health.
"""

from stalwart.health.records import Finding, ProbeResult, ProbeStatus, Severity

__all__ = ["Finding", "ProbeResult", "ProbeStatus", "Severity"]
