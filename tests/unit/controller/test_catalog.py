"""The checkpoint catalog: the nodes' reported saves become entries, pruned to keepLast (plus a pending
rollback's target), written by the controller with its state, and read by `stalwart status`."""

from __future__ import annotations

from typing import Any

from support.controller_harness import JOB, Harness
from support.controller_harness import worker as _worker

from stalwart.controller.core.catalog import kept_steps, reconcile
from stalwart.runner.summary import snapshot
from stalwart.store import keys
from stalwart.store.records import CheckpointEntry, SavedCheckpoint


def saved(step: int, generation: int = 1, *, total: int | None = None, at: float = 0.0, **kw: Any) -> SavedCheckpoint:
    return SavedCheckpoint(
        step=step,
        generation=generation,
        committed_at=at or float(step),
        tiers=kw.pop("tiers", ["memory", "file"]),
        total_bytes=total,
        location=kw.pop("location", f"/ckpt/step-{step:010d}"),
    )


def test_every_reported_step_gets_an_entry_with_the_coordinators_total() -> None:
    change = reconcile({}, [saved(10), saved(20, total=4096), saved(10, total=2048, at=9.5)], keep_last=3)
    assert sorted(change.puts) == [10, 20] and change.deletes == []
    ten = change.puts[10]
    assert (ten.bytes, ten.committed_at, ten.tiers, ten.uri) == (2048, 9.5, ["memory", "file"], "/ckpt/step-0000000010")
    assert change.puts[20].generation == 1


def test_a_total_that_arrives_later_completes_the_entry_and_a_known_save_writes_nothing() -> None:
    first = reconcile({}, [saved(10)], keep_last=3).puts
    assert first[10].bytes is None
    later = reconcile(first, [saved(10), saved(10, total=100)], keep_last=3)
    assert later.puts[10].bytes == 100
    catalog = {**first, **later.puts}
    assert reconcile(catalog, [saved(10), saved(10, total=100)], keep_last=3).puts == {}


def test_pruned_to_keep_last_and_a_pruned_step_reported_again_is_not_written_back() -> None:
    catalog = reconcile({}, [saved(10), saved(20)], keep_last=2).puts
    change = reconcile(catalog, [saved(10), saved(20), saved(30)], keep_last=2)
    assert sorted(change.puts) == [30] and change.deletes == [10]
    catalog = {20: catalog[20], 30: change.puts[30]}
    steady = reconcile(catalog, [saved(10), saved(20), saved(30)], keep_last=2)  # 10 is still in a heartbeat
    assert steady.puts == {} and steady.deletes == []


def test_a_pending_rollback_keeps_its_target() -> None:
    assert kept_steps([10, 20, 30, 40], keep_last=2, rollback_bound=25) == {20, 30, 40}
    assert kept_steps([10, 20, 30, 40], keep_last=2, rollback_bound=30) == {30, 40}
    assert kept_steps([10, 20], keep_last=1, rollback_bound=5) == {20}  # nothing that old: nothing extra
    catalog = reconcile({}, [saved(s) for s in (10, 20, 30)], keep_last=3).puts
    change = reconcile(catalog, [saved(40)], keep_last=2, rollback_bound=15)
    assert sorted(change.puts) == [40] and change.deletes == [20]  # 10: what the rollback loads


def test_a_later_generation_replaces_a_step_and_an_earlier_one_does_not() -> None:
    catalog = reconcile({}, [saved(40, generation=2, total=10)], keep_last=3).puts
    again = reconcile(catalog, [saved(40, generation=3, at=99.0)], keep_last=3).puts[40]
    assert (again.generation, again.committed_at, again.bytes) == (3, 99.0, None)  # saved again after a rollback
    assert reconcile({40: again}, [saved(40, generation=2, total=10)], keep_last=3).puts == {}


def worker(rank: int, **fields: Any) -> Any:
    return _worker(rank, first_step=1, first_step_at=0.0, **fields)


def test_the_controller_writes_the_catalog_from_heartbeats_and_status_reads_it() -> None:
    h = Harness(checkpoint={"intervalSteps": 10, "keepLast": 2})
    h.running()
    for step in (10, 20, 30):
        h.beat("node-0", 1, [worker(0, step=step), worker(1, step=step)], checkpoints=[saved(step, total=step * 100)])
        h.beat("node-1", 1, [worker(2, step=step), worker(3, step=step)], checkpoints=[saved(step)])
        h.tick()
    entries = h.store.get_prefix(keys.checkpoints_prefix(JOB), CheckpointEntry)
    assert [(e.step, e.bytes) for e in entries] == [(20, 2000), (30, 3000)]
    # A new controller (the old one killed) carries on from the catalog in etcd.
    h.new_controller()
    h.beat("node-0", 1, [worker(0, step=40), worker(1, step=40)], checkpoints=[saved(40, total=1), saved(30)])
    h.tick()
    entries = h.store.get_prefix(keys.checkpoints_prefix(JOB), CheckpointEntry)
    assert [e.step for e in entries] == [30, 40]
    summary = snapshot(h.store, JOB, now=h.clock.now)  # type: ignore[arg-type]
    assert summary is not None and [c.step for c in summary.checkpoints] == [40, 30]
