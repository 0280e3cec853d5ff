"""The job controller: the reconcile loop, its core and detectors, rank assignment, election,
incidents and ETTR."""

from stalwart.controller.controller import JobController, NotLeader
from stalwart.controller.ettr import ClassMttr, EttrReport, compute_ettr, mttr_by_class

__all__ = ["ClassMttr", "EttrReport", "JobController", "NotLeader", "compute_ettr", "mttr_by_class"]
