"""Rung 3: a loss spike in the reported series: the loss of the first rank that reports one (rank 0
of the role that trains, whatever the roles' order: a relay, rollout or reward worker reports none)
`lossSpikeFactor` times its recent mean. (NaN is the worker's own failure: the SDK raises it, and crash
classification reads it.) A heartbeat carries the newest step's loss and the peak of the steps since a
few beats ago: a spike between two beats is judged from the peak, once."""

from __future__ import annotations

from collections.abc import Sequence

from stalwart.controller.core.detectors.base import Detector, Failure, Finding, Report, View
from stalwart.controller.core.detectors.node_digests import NodeDigests
from stalwart.controller.core.policy import Classified, is_loss_spike
from stalwart.spec.model import FailureEvent
from stalwart.store.records import WorkerStatus

LOSS_HISTORY = 20


def _first_reporting(workers: Sequence[WorkerStatus], _sent_at: float | None = None) -> WorkerStatus | None:
    """A node's lowest rank that reports a loss at a step."""
    return min((w for w in workers if w.loss is not None and w.step is not None), key=lambda w: w.rank, default=None)


def _judged(step: int, loss: float, rank0: WorkerStatus, judged_step: int | None) -> tuple[int, float]:
    """(step, loss) to judge: the peak of the steps since the newest one judged, when it is higher
    than the newest step's loss; else the newest."""
    peak, at = rank0.peak_loss, rank0.peak_loss_step
    if peak is not None and at is not None and peak > loss and (judged_step is None or at > judged_step):
        return at, peak
    return step, loss


class LossSpikes(Detector):
    name = "loss-spikes"

    def reset(self) -> None:
        self._losses: list[float] = []  # the reporting rank's loss, one value per change
        self._spike: tuple[int, float] | None = None  # (step, loss) reported and not yet handled
        self._handled_step: int | None = None
        self._judged_step: int | None = None  # the newest step judged: a peak after it is new
        self._digests: NodeDigests[WorkerStatus | None] = NodeDigests(_first_reporting)
        self._first: tuple[WorkerStatus | None] | None = None  # the job's, from the nodes' digests

    def observe(self, view: View) -> Report:
        # Roles that do not train (rollouts, reward, reference) report no loss: the series is the
        # lowest job-wide rank that does.
        by_node = self._digests.update(view)
        if self._digests.changed or self._first is None:
            firsts = (w for n in view.state.slots if (w := by_node.get(n)) is not None)  # a walk's order
            self._first = (min(firsts, key=lambda w: w.rank, default=None),)
        rank0 = self._first[0]
        if rank0 is None or rank0.loss is None or rank0.step is None:
            return Report()
        if self._judged_step is not None and rank0.step < self._judged_step:
            self._judged_step = None  # rolled back: the steps are trained again
        step, loss = _judged(rank0.step, rank0.loss, rank0, self._judged_step)
        recent = self._losses[-LOSS_HISTORY:]
        if step != self._handled_step and is_loss_spike(loss, recent, view.spec.fault_tolerance.loss_spike_factor):
            self._spike = (step, loss)
            evidence = [f"loss {loss:.4g} at step {step}, recent mean {sum(recent) / len(recent):.4g}"]
            return Report([Failure(Classified(FailureEvent.LOSS_SPIKE, [], evidence), failed_at=view.now)])
        self._judged_step = rank0.step
        if not self._losses or self._losses[-1] != rank0.loss:
            self._losses.append(rank0.loss)
        return Report()

    def handled(self, finding: Finding, now: float) -> None:
        """Tolerated (an Ignore rule) or rolled back: the spike joins the baseline, once."""
        if self._spike is not None:
            self._handled_step = self._spike[0]
            self._losses.append(self._spike[1])
            self._spike = None
