"""Kueue's queue label: a job never submitted is created suspended; one already submitted keeps
whatever spec.suspend Kueue (or a person) set since."""

from __future__ import annotations

from stalwart_operator import kueue, names


def body(labels: dict[str, str] | None = None, status: dict[str, str] | None = None) -> dict[str, object]:
    return {
        "metadata": {"name": "mu", "labels": labels or {}},
        "spec": {"roles": [{"name": "trainer", "command": ["python", "w.py"]}]},
        "status": status or {},
    }


def test_a_new_job_with_the_queue_label_waits_for_admission() -> None:
    queued = body({names.KUEUE_QUEUE_LABEL: "team-a"})
    assert kueue.queued_for_kueue(queued)
    suspended = kueue.suspended_for_admission(queued)
    assert suspended["spec"]["suspend"] is True  # type: ignore[index]
    assert "suspend" not in queued["spec"]  # type: ignore[operator]  # the body kopf gave is left alone


def test_without_the_label_or_once_submitted_the_spec_decides() -> None:
    assert not kueue.queued_for_kueue(body())
    assert not kueue.queued_for_kueue(body({names.KUEUE_QUEUE_LABEL: ""}))
    assert not kueue.queued_for_kueue(body({names.KUEUE_QUEUE_LABEL: "team-a"}, {"jobId": "default.mu"}))
