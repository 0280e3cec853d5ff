"""Paged prefix reads and the watch-fed prefix mirror (issue 23), against a real etcd.

A prefix of any size is read in pages that each stay under the client's 4 MiB reply (the page
shrinks when its records are big), at one revision; a mirror holds what a watch from that revision
delivers, resumes a broken watch, and reads the prefix again (in pages) when etcd compacted what
the broken watch missed.
"""

from __future__ import annotations

import uuid

import pytest

from stalwart.processes import wait_for
from stalwart.store import Store
from stalwart.store import client as store_client
from stalwart.store.etcd_server import AUTO_COMPACTION_REVISIONS, EtcdServer
from stalwart.store.prefix_mirror import PrefixMirror


def unique(name: str) -> str:
    return f"/stalwart/v1/test/{name}-{uuid.uuid4().hex[:8]}/"


def test_prefix_reads_come_in_pages_under_the_reply_limit(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = unique("pages")
    small = {f"{prefix}k{i:03d}": f"v{i}" for i in range(25)}
    for chunk in (dict(list(small.items())[i : i + 10]) for i in range(0, 25, 10)):
        store.put_batch(chunk)  # type: ignore[arg-type]
    monkeypatch.setattr(store_client, "PAGE_KEYS", 4)
    items, revision = store.read_prefix(prefix)
    assert [(k, v.decode()) for k, v in items] == sorted(small.items()) and revision > 0
    assert store.list_keys(prefix) == sorted(small)
    # Five values of 1.5 MB: a page of four would be over the client's 4 MiB reply, so it shrinks.
    big = unique("big")
    for i in range(5):
        store.put(f"{big}{i}", "x" * 1_500_000)
    assert [len(v) for _, v in store.read_prefix(big)[0]] == [1_500_000] * 5
    assert store.first_key(big, big[:-1] + "0") == f"{big}0"
    store.delete_prefix(big)


def test_a_batch_of_puts_is_one_transaction_within_etcds_limit(store: Store) -> None:
    prefix = unique("batch")
    revision = store.put_batch({f"{prefix}{i}": str(i) for i in range(store_client.MAX_TXN_OPS)})
    assert {int(store.get_raw(f"{prefix}{i}") or b"-1") for i in range(store_client.MAX_TXN_OPS)} == set(range(128))
    assert revision == store.put(f"{prefix}after", "x") - 1  # one revision for the whole batch
    with pytest.raises(ValueError):
        store.put_batch({f"{prefix}{i}": "x" for i in range(store_client.MAX_TXN_OPS + 1)})


def test_the_mirror_reports_changes_and_keeps_the_writes_it_was_told_of(store: Store) -> None:
    prefix = unique("mirror")
    store.put(prefix + "a", "1")
    mirror = PrefixMirror(store, prefix)
    try:
        mirror.start()
        assert mirror.take() == {prefix + "a": b"1"} and mirror.take() == {}
        store.put(prefix + "b", "2")
        store.delete(prefix + "a")
        changes: dict[str, bytes | None] = {}
        assert wait_for(lambda: changes.update(mirror.take()) or len(changes) == 2, timeout=60)
        assert changes == {prefix + "b": b"2", prefix + "a": None}
        # A write this process made is known at once; its own event, and older ones, change nothing.
        revision = store.put(prefix + "c", "mine")
        mirror.note(prefix + "c", b"mine", revision)
        assert mirror.take() == {prefix + "c": b"mine"}
        assert wait_for(lambda: mirror.events >= 3, timeout=60)
        mirror._on_change(prefix + "c", b"older", revision - 1)
        assert mirror.take() in ({}, {prefix + "c": b"mine"}) and mirror.keys() == {prefix + "b", prefix + "c"}
    finally:
        mirror.close()


def test_a_broken_watch_whose_revision_was_compacted_reads_the_prefix_again(store: Store) -> None:
    prefix = unique("resync")
    store.put(prefix + "stays", "1")
    store.put(prefix + "goes", "1")
    mirror = PrefixMirror(store, prefix)
    try:
        mirror.start()
        mirror.take()
        watch = mirror._watch
        assert watch is not None
        with watch._lock:
            watch._stream += 1  # the stream goes deaf, as a broken one: what it still sends is ignored
        store.delete(prefix + "goes")
        store.put(prefix + "new", "2")
        store.put(prefix + "stays", "3")
        revision = store.put(unique("other") + "x", "x")
        store._client.compact(revision)  # etcd forgets the changes the watch missed
        watch._broke(watch)  # the store's resume thread creates it again: compacted, so it reads again
        changes: dict[str, bytes | None] = {}
        assert wait_for(lambda: changes.update(mirror.take()) or mirror.resyncs == 1, timeout=60)
        changes.update(mirror.take())
        assert changes == {prefix + "goes": None, prefix + "new": b"2", prefix + "stays": b"3"}
        assert watch.resynced == 1
        store.put(prefix + "later", "4")  # and the watch goes on from the read's revision
        assert wait_for(lambda: changes.update(mirror.take()) or prefix + "later" in changes, timeout=60)
    finally:
        mirror.close()


def test_the_private_etcd_compacts_its_history() -> None:
    argv = EtcdServer("/tmp/unused-etcd-dir").argv()
    assert "--auto-compaction-mode=revision" in argv
    assert f"--auto-compaction-retention={AUTO_COMPACTION_REVISIONS}" in argv
    assert "--auto-compaction-mode=revision" not in EtcdServer("/tmp/unused", compaction_revisions=None).argv()


def test_a_watch_that_fell_behind_takes_a_batch_over_the_reply_limit(store: Store) -> None:
    """etcd sends a watch from a past revision up to 1,000 revisions in one response. Ten batches of
    128 records of 5 KB are 6.5 MB in one response, over the 4 MiB a read may be: the watch's own
    channel takes it (with the read's limit it broke and resumed from the same revision forever,
    freezing the controller's view at 10,000 nodes)."""
    prefix = unique("behind")
    _, start = store.read_prefix(prefix)
    for batch in range(10):
        store.put_batch({f"{prefix}{batch:02d}-{i:03d}": "x" * 5_000 for i in range(store_client.MAX_TXN_OPS)})  # type: ignore[arg-type]
    seen: list[str] = []
    watch = store.watch_prefix_from(prefix, lambda key, _value, _revision: seen.append(key), lambda: start)
    try:
        assert wait_for(lambda: len(seen) == 10 * store_client.MAX_TXN_OPS, timeout=60)
        assert watch.resumed == 0
    finally:
        watch.cancel()
        store.delete_prefix(prefix)


def test_the_change_hook_hears_each_change_and_a_failing_one_breaks_nothing(store: Store) -> None:
    prefix = unique("hook")
    heard: list[tuple[str, bytes | None]] = []

    def hook(key: str, value: bytes | None) -> None:
        heard.append((key, value))
        if value == b"boom":
            raise RuntimeError("a hook that fails")

    mirror = PrefixMirror(store, prefix, hook)
    try:
        mirror.start()
        store.put(prefix + "a", "boom")
        store.put(prefix + "b", "2")
        store.delete(prefix + "a")
        assert wait_for(lambda: len(heard) == 3, timeout=60)
        assert heard == [(prefix + "a", b"boom"), (prefix + "b", b"2"), (prefix + "a", None)]
        assert mirror.take() == {prefix + "a": None, prefix + "b": b"2"}  # the mirror holds them all
    finally:
        mirror.close()
