"""The job controller: the reconcile loop, its core and detectors, rank assignment, election,
incidents and ETTR."""

from stalwart.controller.core.ettr import ClassMttr, EttrReport, compute_ettr, mttr_by_class
from stalwart.controller.shell.loop import JobController, NotLeader

__all__ = ["ClassMttr", "EttrReport", "JobController", "NotLeader", "compute_ettr", "mttr_by_class"]
