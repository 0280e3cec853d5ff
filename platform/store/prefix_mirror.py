"""A prefix kept in memory by a watch: read whole once (in pages), then fed by its changes.

The controller's view of a job's nodes (issue 23) is built on it: a reader that re-reads a prefix
every tick pays for every key under it, and at 10,000 nodes that prefix is tens of MB (over the
client's 4 MiB reply). A mirror pays once, at its start, and then only for what changed.

- Start: a paged read (`Store.read_prefix`, every page at one revision), then a watch from the
  revision after it, so nothing between the two is missed.
- A broken stream (etcd restarted, paused, a dropped connection) is resumed from the revision after
  the last change delivered (prefix_watch.py): nothing is missed, nothing read again.
- A resume that finds that revision compacted away reads the prefix again, in pages, and reports
  every key that changed in between, deletes included (`resyncs` counts them).

`take()` hands the changes since the last call to one consumer (the tick): a key whose value is
None is gone. A change made locally (`note`, with the revision the write returned) is not undone by
an older event that arrives after it. `on_change`, when given, hears of each change from etcd as it
arrives (on the watch's thread), so that a consumer can sleep until something happened instead of
polling `take()`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from stalwart.logs import get_logger
from stalwart.store.client import Store
from stalwart.store.prefix_watch import PrefixWatch

log = get_logger("stalwart.store.mirror")


class PrefixMirror:
    def __init__(self, store: Store, prefix: str, on_change: Callable[[str, bytes | None], None] | None = None) -> None:
        """`on_change(key, value)` runs on the watch's thread after each change is recorded: it must
        be quick and must not call back into the mirror's lock holders."""
        self.store, self.prefix = store, prefix
        self._on_change_hook = on_change
        self._lock = threading.Lock()
        self._revisions: dict[str, int] = {}  # every key present, with its mod revision
        self._changed: dict[str, bytes | None] = {}  # since the last take
        self._watch: PrefixWatch | None = None
        self.resyncs = 0  # whole reads after the first (a compacted watch revision)
        self.events = 0  # changes delivered by the watch

    @property
    def started(self) -> bool:
        return self._watch is not None

    def start(self) -> None:
        """Read the prefix and watch it; raises StoreUnavailable if etcd is away (call again)."""
        if self._watch is None:
            self._watch = self.store.watch_prefix_from(self.prefix, self._on_change, self._resync)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    def keys(self) -> set[str]:
        with self._lock:
            return set(self._revisions)

    def take(self) -> dict[str, bytes | None]:
        """Every key that changed since the last call, with its value now (None: deleted)."""
        with self._lock:
            changed, self._changed = self._changed, {}
        return changed

    def note(self, key: str, value: bytes, revision: int) -> None:
        """A write this process made (and etcd acknowledged at `revision`): known at once, not only
        when its event comes back; events older than it are ignored."""
        with self._lock:
            if revision >= self._revisions.get(key, 0):
                self._revisions[key] = revision
                self._changed[key] = value

    def _on_change(self, key: str, value: bytes | None, revision: int) -> None:
        with self._lock:
            self.events += 1
            if revision < self._revisions.get(key, 0):
                return  # older than a write this process already noted
            if value is None:
                self._revisions.pop(key, None)
            else:
                self._revisions[key] = revision
            self._changed[key] = value
        self._tell(key, value)

    def _resync(self) -> int:
        """The whole prefix again (the first read, or after a compaction): every key that differs
        from what the mirror held is reported changed, and a key no longer there as deleted."""
        items, revision = self.store.read_prefix(self.prefix)
        with self._lock:
            first = not self._revisions and not self._changed and self._watch is None
            gone = set(self._revisions) - {key for key, _ in items}
            self._revisions = dict.fromkeys((key for key, _ in items), revision)
            for key in gone:
                self._changed[key] = None
            for key, value in items:
                self._changed[key] = value
            if not first:
                self.resyncs += 1
        if not first:
            for key in gone:
                self._tell(key, None)
            for key, value in items:
                self._tell(key, value)
        return revision

    def _tell(self, key: str, value: bytes | None) -> None:
        """`on_change`, which must not break the watch's thread (the mirror holds the change anyway)."""
        if self._on_change_hook is None:
            return
        try:
            self._on_change_hook(key, value)
        except Exception as exc:
            log.error("a mirror's change hook failed", fields={"prefix": self.prefix, "key": key, "error": repr(exc)})
