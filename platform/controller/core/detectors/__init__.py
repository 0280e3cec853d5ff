"""The detectors, in priority order: when several find a failure in one tick, the first one's is
handled (one incident per decision). Adding a detector is a new module and one line here; the
interface is in base.py and docs/control-plane.md."""

from __future__ import annotations

from stalwart.controller.core.detectors.base import Detector
from stalwart.controller.core.detectors.code_updates import CodeUpdates
from stalwart.controller.core.detectors.crashes import Crashes
from stalwart.controller.core.detectors.dataplane_hangs import DataPlaneHangs
from stalwart.controller.core.detectors.hangs import Hangs
from stalwart.controller.core.detectors.loss_spikes import LossSpikes
from stalwart.controller.core.detectors.lost_nodes import LostNodes
from stalwart.controller.core.detectors.machine_faults import MachineFaults
from stalwart.controller.core.detectors.metric_outliers import MetricOutliers
from stalwart.controller.core.detectors.mfu_decline import MfuDecline
from stalwart.controller.core.detectors.operator_requests import OperatorRequests
from stalwart.controller.core.detectors.slowdowns import Slowdowns
from stalwart.controller.core.detectors.stragglers import Stragglers

DETECTORS: tuple[type[Detector], ...] = (
    OperatorRequests,
    CodeUpdates,
    MachineFaults,
    LostNodes,
    Crashes,
    LossSpikes,
    Hangs,
    DataPlaneHangs,
    Slowdowns,
    Stragglers,
    MetricOutliers,
    MfuDecline,
)


def default_detectors() -> list[Detector]:
    return [detector() for detector in DETECTORS]


__all__ = ["DETECTORS", "Detector", "default_detectors"]
