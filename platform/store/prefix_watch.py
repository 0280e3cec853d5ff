"""Prefix watches that outlive etcd going away (a restart, a pause, a dropped connection).

The client's watch stream ends when etcd stops answering, and the client also drops every watch of
a connection it gave up on after a failed call. A `PrefixWatch` notices its stream ended and the
store's `Watches` creates it again, on one thread (attempts made side by side would tear down each
other's connections), from the revision after the last change it delivered: a change made while it
was away is delivered once it is back, none twice. A watch starts at the revision read just before
it, so nothing between that read and its creation is missed either.

A watch with a `resync` (a mirror of the prefix, prefix_mirror.py) starts from the revision its
first read returns, and when etcd has compacted the changes it missed, it reads the prefix again
through `resync` instead of resuming with a gap.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyetcd
from pyetcd.events import DeleteEvent, PutEvent

from stalwart.logs import get_logger

if TYPE_CHECKING:
    from stalwart.store.client import Store

Changes = Callable[[str, "bytes | None", int], None]  # (key, value or None for a delete, its mod revision)
Resync = Callable[[], int]  # reads the prefix whole; returns the revision it read at

RESUME_SECONDS = 0.5  # between attempts to create broken watches again while etcd is away

log = get_logger("stalwart.store.watch")


class PrefixWatch:
    def __init__(
        self,
        store: Store,
        prefix: str,
        callback: Changes,
        broke: Callable[[PrefixWatch], None],
        resync: Resync | None = None,
    ) -> None:
        """`callback(key, value, revision)` for every change under `prefix` (value None: a delete),
        from the thread of the client's watch stream; `broke(self)` when the stream ended."""
        self.store, self.prefix, self.callback, self._broke = store, prefix, callback, broke
        self._resync = resync
        self._lock = threading.Lock()
        self._stream = 0  # numbers each creation: what an older stream still sends is ignored
        self._next_revision = 0
        self._watch_id: int | None = None
        self._cancelled = False
        self.resumed = 0  # times the watch was created again
        self.resynced = 0  # times the prefix was read again because etcd compacted what we missed
        self._compacted: int | None = None  # etcd said our start revision is compacted (to this one)

    def start(self) -> None:
        """Read the revision (or the whole prefix, with a resync), then watch from the one after
        it; raises StoreUnavailable if etcd is away."""
        if self._resync is not None:
            self._next_revision = self._resync() + 1
        else:
            response = self.store._call(lambda: self.store._client.get_response(self.prefix, keys_only=True, limit=1))
            self._next_revision = int(response.header.revision) + 1
        self._create()

    def resume(self) -> None:
        """Create the broken watch again from where it stopped; raises StoreUnavailable if etcd is away."""
        self._create()
        self.resumed += 1
        log.info("watch resumed", fields={"prefix": self.prefix, "from_revision": self._next_revision})

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            self._stream += 1
            watch_id, self._watch_id = self._watch_id, None
        if watch_id is not None:
            try:
                self.store._client.cancel_watch(watch_id)
            except Exception:  # etcd may be gone already: cancelling must not fail
                pass

    def _create(self) -> None:
        with self._lock:
            self._stream += 1
            stream, compacted, self._compacted = self._stream, self._compacted, None
        if compacted is not None:
            self._after_compaction(compacted)

        def on_response(response: object) -> None:
            self._on_response(stream, response)

        def add() -> int:
            with self._lock:
                start = self._next_revision
            try:
                return int(self.store._client.add_watch_prefix_callback(self.prefix, on_response, start_revision=start))
            except pyetcd.exceptions.RevisionCompactedError as exc:
                self._after_compaction(exc.compacted_revision)
                if self._resync is None:
                    raise  # the next attempt starts at the oldest revision etcd has
                with self._lock:
                    start = self._next_revision
                return int(self.store._client.add_watch_prefix_callback(self.prefix, on_response, start_revision=start))

        watch_id = self.store._call(add)
        with self._lock:
            if stream == self._stream:
                self._watch_id = watch_id

    def _after_compaction(self, compacted: int) -> None:
        """etcd compacted the changes after our revision away. A mirror (`resync`) reads the prefix
        again: it then holds every change, and the watch goes on from that read's revision. A plain
        watch goes on from the oldest revision etcd has: the changes in between are lost."""
        fields = {"prefix": self.prefix, "from": self._next_revision, "compacted": compacted}
        if self._resync is not None:
            log.warning("watch's revision was compacted; reading the prefix again", fields=fields)
            revision = self._resync()
            self.resynced += 1
            with self._lock:
                self._next_revision = revision + 1
            return
        log.warning("watch resumes after a compaction; changes in between are lost", fields=fields)
        with self._lock:
            self._next_revision = compacted

    def _on_response(self, stream: int, response: object) -> None:
        events = getattr(response, "events", None)
        with self._lock:
            if stream != self._stream or self._cancelled:
                return  # a stream already replaced, or a cancelled watch
            if events is None:  # the stream ended (an error, the client closed it, or a compaction)
                self._stream += 1
                self._watch_id = None
                if isinstance(response, pyetcd.exceptions.RevisionCompactedError):
                    # etcd announces a compacted start revision after it created the watch
                    self._compacted = int(response.compacted_revision)
        if events is None:
            self._broke(self)
            return
        for event in events:
            if isinstance(event, PutEvent):
                self.callback(event.key.decode(), event.value, int(event.mod_revision))
            elif isinstance(event, DeleteEvent):
                self.callback(event.key.decode(), None, int(event.mod_revision))
            with self._lock:
                self._next_revision = max(self._next_revision, int(event.mod_revision) + 1)


class Watches:
    """A store's watches, and the one thread that creates the broken ones again."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._all: list[PrefixWatch] = []
        self._broken: list[PrefixWatch] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, prefix: str, callback: Changes, resync: Resync | None = None) -> PrefixWatch:
        watch = PrefixWatch(self.store, prefix, callback, self._on_broken, resync)
        watch.start()
        with self._lock:
            self._all.append(watch)
        return watch

    def close(self) -> None:
        self._closed.set()
        self._wake.set()
        with self._lock:
            watches, self._all, self._broken = self._all, [], []
        for watch in watches:
            watch.cancel()

    def _on_broken(self, watch: PrefixWatch) -> None:
        """From the stream's thread: never resume there (the client joins it before opening another)."""
        with self._lock:
            if self._closed.is_set():
                return
            if watch not in self._broken:
                self._broken.append(watch)
            if self._thread is None:
                self._thread = threading.Thread(target=self._resume_loop, name="watch-resume", daemon=True)
                self._thread.start()
        self._wake.set()

    def _resume_loop(self) -> None:
        from stalwart.store.client import StoreUnavailable

        while not self._closed.is_set():
            self._wake.wait()
            self._wake.clear()
            while not self._closed.is_set():
                with self._lock:
                    todo = list(self._broken)
                if not todo:
                    break
                try:
                    for watch in todo:
                        watch.resume()
                        with self._lock:
                            if watch in self._broken:
                                self._broken.remove(watch)
                except StoreUnavailable:
                    self._closed.wait(RESUME_SECONDS)
