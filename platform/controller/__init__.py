"""The job controller: state machine, rank assignment, election, incidents and ETTR."""

from stalwart.controller.controller import JobController, NotLeader
from stalwart.controller.ettr import EttrReport, compute_ettr

__all__ = ["EttrReport", "JobController", "NotLeader", "compute_ettr"]
