"""The controller's loop paces Python's cyclic collector (issue 42): what survived a tick is frozen,
so an automatic collection does not walk the whole view in the middle of the next tick; a full
collection comes between two ticks, now and then, and frees the cycles among the frozen."""

from __future__ import annotations

import gc
import weakref

from stalwart.controller.shell.loop import CollectorPacing


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_what_survived_a_tick_is_frozen_and_collected_in_full_now_and_then() -> None:
    pacing = CollectorPacing(every=3600.0)
    try:
        cycle = _Cycle()
        alive = weakref.ref(cycle)
        pacing.after_tick()
        assert gc.get_freeze_count() > 0
        del cycle
        gc.collect()
        assert alive() is not None  # frozen: the automatic (and a plain) collection leaves it
        pacing.every, pacing._full_at = 0.0, 0.0  # a full collection is due
        pacing.after_tick()
        assert alive() is None  # unfrozen and collected between two ticks
    finally:
        gc.unfreeze()
