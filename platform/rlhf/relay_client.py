"""The relay's client, for every role: the actor takes ready groups, workers lease and submit."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from stalwart.rlhf.connection import ChannelFinished, Connection
from stalwart.rlhf.contract import RELAY_CHANNEL, DataPlaneContext
from stalwart.rlhf.endpoints import EndpointDirectory
from stalwart.rlhf.lineage import Lineage, WeightVersion
from stalwart.rlhf.messages import (
    Advance,
    Demand,
    DemandReply,
    Finish,
    Group,
    Lease,
    LeaseReply,
    PromptItem,
    Resume,
    Stage,
    Stats,
    Submit,
    SubmitReply,
    Take,
    TakeReply,
)

POLL_SECONDS = 5.0  # each long poll's wait: short enough to notice a relay that went away


class TakeTimeout(RuntimeError):
    """The asked groups were not all ready within the take's limit."""


class RelayClient:
    """`incarnation`: the actor's, on every actor rank (the relay refuses a superseded one's requests)."""

    def __init__(
        self,
        ctx: DataPlaneContext,
        client: str,
        *,
        incarnation: str = "",
        directory: EndpointDirectory | None = None,
    ) -> None:
        self.incarnation = incarnation
        self.directory = directory or ctx.directory()
        self._own_directory = directory is None
        self.conn = Connection(self.directory, RELAY_CHANNEL, client, token=ctx.token, on_connect=self._reconnected)
        self._session: tuple[Lineage, int] | None = None  # the actor's: said again to a new relay

    # -- the actor ---------------------------------------------------------------------------------
    def resume(self, lineage: Lineage, watermark: int) -> None:
        """Say who the actor is and where it resumes; said again on every reconnection (a restarted
        relay starts empty and learns it from here).

        Every actor rank says it and keeps it current with `advance`: whichever rank reaches a new
        relay first must tell it, since the others may be blocked in a collective waiting for that
        rank's groups, which no rollout may make before the relay knows the actor's lineage."""
        self.conn.call(Resume(lineage=lineage, watermark=watermark))
        self._session = (lineage, watermark)

    def advance(self, watermark: int) -> None:
        if self._session is not None:
            self._session = (self._session[0], watermark)
        self.conn.call(Advance(incarnation=self.incarnation, watermark=watermark))

    def demand(self, items: Sequence[PromptItem]) -> DemandReply:
        header, _ = self.conn.call(Demand(incarnation=self.incarnation, items=list(items)))
        return DemandReply.model_validate(header)

    def take(
        self,
        items: Sequence[PromptItem],
        *,
        limit: float = 3600.0,
        on_wait: Callable[[TakeReply], None] | None = None,
    ) -> list[Group]:
        """The groups of these prompts, in order, once all are ready. Blocks up to `limit` seconds."""
        start = time.monotonic()
        while True:
            request = Take(incarnation=self.incarnation, items=list(items), wait_seconds=POLL_SECONDS)
            header, _ = self.conn.call(request, wait=POLL_SECONDS)
            reply = TakeReply.model_validate(header)
            if reply.ready:
                return reply.groups
            if on_wait is not None:
                on_wait(reply)
            if time.monotonic() - start > limit:
                raise TakeTimeout(f"{len(items)} groups not ready after {limit:.0f}s: waiting at {reply.waiting}")

    def finish(self) -> None:
        self.conn.call(Finish())

    def stats(self) -> dict[str, Any]:
        header, _ = self.conn.call(Stats())
        stats: dict[str, Any] = header["stats"]
        return stats

    # -- the workers -------------------------------------------------------------------------------
    def lease(
        self, stage: Stage, max_groups: int, *, have_version: WeightVersion | None = None, wait: float = POLL_SECONDS
    ) -> LeaseReply:
        """Groups to work on; status "done" once the actor has finished (even if the relay is gone)."""
        request = Lease(stage=stage, max_groups=max_groups, have_version=have_version, wait_seconds=wait)
        try:
            header, _ = self.conn.call(request, wait=wait)
        except ChannelFinished:
            return LeaseReply(status="done")
        return LeaseReply.model_validate(header)

    def submit(self, stage: Stage, lease_id: str, groups: Sequence[Group]) -> SubmitReply:
        header, _ = self.conn.call(Submit(stage=stage, lease_id=lease_id, groups=list(groups)))
        return SubmitReply.model_validate(header)

    def serve(self, stage: Stage, groups_per_lease: int, fill: Callable[[list[Group]], list[Group]]) -> int:
        """A reward or reference worker's loop: lease the groups waiting for `stage`, fill in its part,
        submit, until the actor has finished. Returns how many groups were accepted."""
        accepted = 0
        while True:
            reply = self.lease(stage, groups_per_lease)
            if reply.status == "done":
                return accepted
            if reply.status == "ok":
                accepted += self.submit(stage, reply.lease_id, fill(reply.groups)).accepted

    def close(self) -> None:
        self.conn.close()
        if self._own_directory:
            self.directory.close()

    def _reconnected(self, conn: Connection) -> None:
        if self._session is not None:
            lineage, watermark = self._session
            conn.call(Resume(lineage=lineage, watermark=watermark))
