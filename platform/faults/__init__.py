"""Fault injection for tests and demos."""

from stalwart.faults.etcd_faults import EtcdFaults
from stalwart.faults.injector import FaultInjector, FiredFault
from stalwart.faults.spec import (
    CONTROLLER_CRASH_ENV,
    FaultKind,
    FaultSpec,
    controller_fault_env,
    node_fault_env,
    parse_fault,
    preflight_fault_env,
)

__all__ = [
    "CONTROLLER_CRASH_ENV",
    "controller_fault_env",
    "EtcdFaults",
    "FaultInjector",
    "FaultKind",
    "FaultSpec",
    "FiredFault",
    "node_fault_env",
    "parse_fault",
    "preflight_fault_env",
]
