"""Kueue's suspend-based admission of a TrainingJob, as Kueue does it for a batch/v1 Job.

A TrainingJob labelled `kueue.x-k8s.io/queue-name` is created suspended (what Kueue's webhook does
for a Job): nothing starts until Kueue admits its Workload and unsets `spec.suspend`. When Kueue
preempts it, it sets `spec.suspend` again: the controller asks the workers for a checkpoint at a
step just ahead and waits for its commit (stalwart.controller.core.suspension, bounded by
`checkpoint.saveBeforeSuspendSeconds`), then stops the workers and the pods and keeps the job's
state; admitted again, the job resumes from that checkpoint as a new generation. The suspension
itself is the one `spec.suspend` always drove (the controller's SuspendSaving, then Suspended
stages); this module only decides the initial state.
"""

from __future__ import annotations

from typing import Any

from stalwart_operator import names


def queued_for_kueue(body: dict[str, Any]) -> bool:
    """Whether this job is one Kueue must admit first: it carries the queue label and has never been
    handed to a controller (a job the operator already submitted keeps the suspend it has)."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    submitted = bool((body.get("status") or {}).get("jobId"))
    return bool(labels.get(names.KUEUE_QUEUE_LABEL)) and not submitted


def suspended_for_admission(body: dict[str, Any]) -> dict[str, Any]:
    """The body with `spec.suspend` set, as the job is first submitted while it waits for Kueue."""
    spec = dict(body.get("spec") or {})
    spec["suspend"] = True
    return {**body, "spec": spec}
