"""Fault injection for tests and demos."""

from stalwart.faults.injector import FaultInjector, FiredFault
from stalwart.faults.spec import FaultKind, FaultSpec, parse_fault, preflight_fault_env

__all__ = ["FaultInjector", "FaultKind", "FaultSpec", "FiredFault", "parse_fault", "preflight_fault_env"]
