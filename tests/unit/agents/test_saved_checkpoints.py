"""The agent's side of the catalog: its ranks' save reports merged per step, bounded, without secrets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stalwart.agents.saved_checkpoints import SavedCheckpoints, without_secrets
from stalwart.store.records import CheckpointTiming, ProgressReport


def report(step: int, rank: int, *, total: int | None = None, committed: bool = True, **kw: object) -> ProgressReport:
    timing = CheckpointTiming(
        operation=kw.pop("operation", "save"),  # type: ignore[arg-type]
        committed=committed,
        bytes_written=10,
        tiers=["memory", "file"],
        total_bytes=total,
        location=f"/ckpt/step-{step:010d}",
    )
    return ProgressReport(
        kind="checkpoint", rank=rank, local_rank=rank, step=step, generation=1, sent_at=100.0 + rank, checkpoint=timing
    )


def test_the_ranks_reports_of_a_save_are_one_entry_with_the_coordinators_total() -> None:
    saves = SavedCheckpoints()
    saves.record(report(10, 1))
    saves.record(report(10, 0, total=20))
    (only,) = saves.newest()
    assert (only.step, only.generation, only.total_bytes, only.committed_at) == (10, 1, 20, 100.0)
    assert only.tiers == ["memory", "file"] and only.location == "/ckpt/step-0000000010"


def test_failed_saves_and_loads_are_not_saves() -> None:
    saves = SavedCheckpoints()
    saves.record(report(10, 0, committed=False))
    saves.record(report(20, 0, operation="load"))
    saves.record(ProgressReport(kind="step", rank=0, local_rank=0, step=30))
    assert saves.newest() == []


def test_a_bare_report_counts_with_the_uri_the_workers_were_given() -> None:
    saves = SavedCheckpoints()
    saves.default_location = "s3://bucket/run"
    saves.record(ProgressReport(kind="checkpoint", rank=0, local_rank=0, step=5, generation=2, sent_at=1.0))
    (only,) = saves.newest()
    assert (only.step, only.location, only.tiers, only.total_bytes) == (5, "s3://bucket/run", [], None)


def test_the_newest_few_are_kept_newest_first() -> None:
    saves = SavedCheckpoints(kept=3)
    for step in range(10, 60, 10):
        saves.record(report(step, 0))
    assert [s.step for s in saves.newest()] == [50, 40, 30]


def test_uris_lose_their_credentials_and_queries() -> None:
    assert without_secrets("s3://key:secret@bucket/run?endpoint=http://minio:9000") == "s3://bucket/run"
    assert without_secrets("mem://127.0.0.1:7000/job?peer=x") == "mem://127.0.0.1:7000/job"
    assert without_secrets("/data/ckpt") == "/data/ckpt"


def test_report_save_carries_what_the_catalog_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    from stalwart.agents import worker_sdk

    sent: list[ProgressReport] = []
    monkeypatch.setattr(worker_sdk, "_send", sent.append)
    result = SimpleNamespace(
        step=10,
        committed=True,
        stall_seconds=0.1,
        total_seconds=1.0,
        bytes_written=5,
        total_bytes=20,
        tiers=["memory", "file"],
        location="/ckpt/step-0000000010",
    )
    worker_sdk.report_save(result)  # type: ignore[arg-type]
    del result.total_bytes, result.location  # a checkpointer of one's own may not say these
    worker_sdk.report_save(result)  # type: ignore[arg-type]
    saves = SavedCheckpoints()
    saves.record(sent[0])
    (only,) = saves.newest()
    assert (only.total_bytes, only.location) == (20, "/ckpt/step-0000000010")
    assert sent[1].checkpoint is not None and (sent[1].checkpoint.total_bytes, sent[1].checkpoint.location) == (
        None,
        None,
    )
