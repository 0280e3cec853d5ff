"""Fault injection for tests and demos."""

from stalwart.faults.injector import FaultInjector, FiredFault
from stalwart.faults.spec import FaultKind, FaultSpec, parse_fault

__all__ = ["FaultInjector", "FaultKind", "FaultSpec", "FiredFault", "parse_fault"]
