"""Operator requests (`stalwart node evict|cordon|uncordon`, `stalwart check`, the Kubernetes
operator's evictions): the oldest pending one, in every stage but the last; the core carries it
out (stalwart.controller.core.requests)."""

from __future__ import annotations

from stalwart.controller.core.detectors.base import Detector, Report, RequestFinding, View
from stalwart.store.records import JobStage


class OperatorRequests(Detector):
    name = "operator-requests"
    stages = frozenset(s for s in JobStage if not s.terminal)

    def observe(self, view: View) -> Report:
        if view.obs.request is None:
            return Report()
        return Report([RequestFinding(*view.obs.request)])
