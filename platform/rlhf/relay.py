"""The relay's state machine: prompt groups move rollout -> reward -> reference -> ready, under leases.

Pure bookkeeping behind one lock (no sockets, an injected clock), so every rule is unit-tested:

- A worker leases the lowest-position groups waiting for its stage. The lease ends when the worker
  submits, when its connection closes (a dead worker: its groups return at once) or after
  `leaseSeconds` (a hung worker). A returned group goes back to the stage that held it: a rollout's
  group is generated again from the same prompt; a reward or reference worker's is scored again.
- A submission counts only if its lease still holds the group: late results of a lease that was
  given away are dropped, so nothing is counted twice.
- Rollouts only get prompts they may generate with the weights they have: the weights' step must be
  at least `step - 1 - maxWeightStaleness` and on the actor's lineage (see lineage.py).
- The buffer is bounded: the relay holds at most `relayCapacity` groups, always the lowest positions
  demanded, so the actor's next step is never starved by look-ahead.
- The watermark is the actor's loader position: everything before it was trained on. Demand below
  it is refused; a restarted actor moves it back to its checkpoint and says which versions remain.
- The actor's requests carry its incarnation: those of an incarnation that a newer one superseded (a
  rank that has not died yet) are refused, so they can neither take groups nor move the watermark.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stalwart.rlhf.lineage import Lineage, WeightVersion
from stalwart.rlhf.messages import (
    Demand,
    DemandReply,
    Group,
    Lease,
    LeaseReply,
    PromptItem,
    Stage,
    Submit,
    SubmitReply,
    Take,
    TakeReply,
)
from stalwart.spec.model import DataPlaneSettings

WAIT_SLICE = 0.5  # waits wake at least this often to expire leases


class RelayError(ValueError):
    """A request the relay refuses: the message says what is inconsistent."""


@dataclass
class _Entry:
    prompt: PromptItem
    stage: Stage = Stage.ROLLOUT
    group: Group | None = None
    lease_id: str | None = None  # the lease holding it, if a worker has it


@dataclass
class _Lease:
    client: str
    stage: Stage
    deadline: float
    positions: set[int] = field(default_factory=set)


class Relay:
    def __init__(self, settings: DataPlaneSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._cond = threading.Condition()
        self._entries: dict[int, _Entry] = {}
        self._leases: dict[str, _Lease] = {}
        self.lineage = Lineage()
        self.watermark = 0
        self.done = False
        self.counts: Counter[str] = Counter()
        self._superseded: set[str] = set()
        # Worker ("role-rank") -> when a lease of its expired holding groups: a hung worker, for the
        # controller (stalwart.controller.core.detectors.dataplane_hangs) to localize to its node.
        self.expired_at: dict[str, float] = {}

    # -- the actor ---------------------------------------------------------------------------------
    def resume(self, lineage: Lineage, watermark: int) -> None:
        """A (re)started actor: groups before its watermark are gone, groups made with weights that are
        no longer history go back to their rollout stage.

        Every rank of an incarnation says it (each may be the first to reach a new relay), so the
        same incarnation saying it again never moves the watermark back: a rank one step behind
        another must not reopen positions already trained on. A new incarnation moves it anywhere
        (back to its checkpoint)."""
        if lineage.current is None:
            raise RelayError("an actor resumes with an empty lineage")
        with self._cond:
            incarnation = lineage.current.incarnation
            if incarnation in self._superseded:
                raise RelayError(f"actor incarnation {incarnation} was superseded: it may not resume")
            same = self.lineage.current is not None and self.lineage.current.incarnation == incarnation
            if self.lineage.current is not None and not same:
                self._superseded.add(self.lineage.current.incarnation)
            watermark = max(watermark, self.watermark) if same else watermark
            self.lineage, self.watermark, self.done = lineage, watermark, self.done and same
            self._drop_below(watermark)
            for entry in self._entries.values():
                if entry.group is not None and not lineage.valid(entry.group.version):
                    self._reset(entry, Stage.ROLLOUT)
                    self.counts["invalidated"] += 1
            self._cond.notify_all()

    def advance(self, incarnation: str, watermark: int) -> None:
        with self._cond:
            self._fence(incarnation)
            if watermark > self.watermark:
                self.watermark = watermark
                self._drop_below(watermark)

    def demand(self, request: Demand) -> DemandReply:
        with self._cond:
            self._fence(request.incarnation)
            accepted, held, refused = self._admit(request.items)
            self._cond.notify_all()
            return DemandReply(accepted=accepted, held=held, refused=refused)

    def take(self, request: Take) -> TakeReply:
        """Wait (up to wait_seconds) until every asked group is ready, then hand them over, once."""
        if len(request.items) > self.settings.relay_capacity:
            raise RelayError(
                f"one take asks for {len(request.items)} groups but relayCapacity is "
                f"{self.settings.relay_capacity}: raise it to at least the prompts of one step"
            )
        deadline = time.monotonic() + request.wait_seconds
        positions = [item.position for item in request.items]
        with self._cond:
            self._fence(request.incarnation)
            low = min(positions)
            if low < self.watermark:
                raise RelayError(f"position {low} was trained on already (the watermark is {self.watermark})")
            self._admit(request.items)
            self._cond.notify_all()
            while True:
                self._expire()
                entries = [self._entries.get(p) for p in positions]
                if all(e is not None and e.stage is Stage.READY for e in entries):
                    groups = []
                    for p in positions:
                        entry = self._entries.pop(p)
                        assert entry.group is not None
                        groups.append(entry.group)
                    self.counts["taken"] += len(groups)
                    return TakeReply(ready=True, groups=groups)
                left = deadline - time.monotonic()
                if left <= 0:
                    waiting = Counter(e.stage.value if e is not None else "evicted" for e in entries)
                    return TakeReply(ready=False, waiting=dict(waiting))
                self._cond.wait(min(left, WAIT_SLICE))

    def finish(self) -> None:
        with self._cond:
            self.done = True
            self._cond.notify_all()

    # -- the workers ---------------------------------------------------------------------------------
    def lease(self, client: str, request: Lease) -> LeaseReply:
        if request.stage is Stage.READY:
            raise RelayError("the ready stage is the actor's: it takes, it does not lease")
        deadline = time.monotonic() + request.wait_seconds
        with self._cond:
            while True:
                if self.done:
                    return LeaseReply(status="done")
                self._expire()
                reply = self._try_lease(client, request)
                if reply is not None:
                    return reply
                left = deadline - time.monotonic()
                if left <= 0:
                    return LeaseReply(status="empty")
                self._cond.wait(min(left, WAIT_SLICE))

    def submit(self, client: str, request: Submit) -> SubmitReply:
        part = _PART[request.stage]
        if part is not None and any(getattr(g, part) is None for g in request.groups):
            raise RelayError(f"a {request.stage.value} submission must fill in {part} for every group")
        with self._cond:
            lease = self._leases.pop(request.lease_id, None)
            if lease is None or lease.client != client or lease.stage is not request.stage:
                self.counts[f"late.{request.stage.value}"] += len(request.groups)
                return SubmitReply(accepted=0, dropped=len(request.groups))
            accepted, stale = 0, False
            for group in request.groups:
                position = group.prompt.position
                entry = self._entries.get(position)
                if (
                    position not in lease.positions
                    or entry is None
                    or entry.lease_id != request.lease_id
                    or entry.prompt.sample_id != group.prompt.sample_id
                ):
                    self.counts[f"late.{request.stage.value}"] += 1
                    continue
                lease.positions.discard(position)
                entry.lease_id = None
                if request.stage is Stage.ROLLOUT and not self._fresh(group.version, entry.prompt.step):
                    stale = True
                    self.counts["stale"] += 1
                    continue
                entry.group = self._merge(entry, group, request.stage)
                entry.stage = _NEXT[request.stage]
                accepted += 1
                self.counts[f"done.{request.stage.value}"] += 1
            for position in lease.positions:  # leased but not returned: back to the stage for another worker
                entry = self._entries.get(position)
                if entry is not None and entry.lease_id == request.lease_id:
                    entry.lease_id = None
            self._cond.notify_all()
            return SubmitReply(accepted=accepted, dropped=len(request.groups) - accepted, stale_weights=stale)

    def release(self, client: str) -> int:
        """The client's connection closed: every group it held returns to its stage. Returns how many."""
        with self._cond:
            n = 0
            for lease_id in [i for i, lease in self._leases.items() if lease.client == client]:
                n += self._end_lease(lease_id, "released")
            if n:
                self._cond.notify_all()
            return n

    # -- views -------------------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        with self._cond:
            holding: Counter[str] = Counter()
            for lease in self._leases.values():
                holding[lease.client.split("#", 1)[0]] += len(lease.positions)
            return {
                "watermark": self.watermark,
                "done": self.done,
                "held": dict(Counter(e.stage.value for e in self._entries.values())),
                "holding": dict(holding),
                "counts": dict(self.counts),
                "expired_at": dict(self.expired_at),
                "lineage": self.lineage.model_dump(),
            }

    # -- inside the lock ---------------------------------------------------------------------------
    def _fence(self, incarnation: str) -> None:
        current = self.lineage.current
        if incarnation in self._superseded or (current is not None and incarnation != current.incarnation):
            who = current.incarnation if current is not None else "none"
            raise RelayError(f"actor incarnation {incarnation} is not the current one ({who}): refused")

    def _min_version(self, step: int) -> int:
        return max(0, step - 1 - self.settings.max_weight_staleness)

    def _fresh(self, version: WeightVersion, step: int) -> bool:
        return self.lineage.valid(version) and version.step >= self._min_version(step)

    def _try_lease(self, client: str, request: Lease) -> LeaseReply | None:
        waiting = sorted(
            (e for e in self._entries.values() if e.stage is request.stage and e.lease_id is None),
            key=lambda e: e.prompt.position,
        )
        if request.stage is Stage.ROLLOUT:
            have = request.have_version
            if waiting and (have is None or not self.lineage.valid(have)) and self.lineage.entries:
                return LeaseReply(status="need-newer-weights")
            if have is None or not self.lineage.valid(have):
                return None
            usable = [e for e in waiting if self._min_version(e.prompt.step) <= have.step]
            if waiting and not usable:
                return LeaseReply(status="need-newer-weights")
            waiting = usable
        if not waiting:
            return None
        chosen = waiting[: request.max_groups]
        lease_id = uuid.uuid4().hex
        deadline = self._clock() + self.settings.lease_seconds
        self._leases[lease_id] = _Lease(client, request.stage, deadline, {e.prompt.position for e in chosen})
        for entry in chosen:
            entry.lease_id = lease_id
        self.counts[f"leased.{request.stage.value}"] += len(chosen)
        if request.stage is Stage.ROLLOUT:
            return LeaseReply(
                status="ok",
                lease_id=lease_id,
                prompts=[e.prompt for e in chosen],
                min_versions=[self._min_version(e.prompt.step) for e in chosen],
            )
        return LeaseReply(status="ok", lease_id=lease_id, groups=[e.group for e in chosen if e.group is not None])

    @staticmethod
    def _merge(entry: _Entry, group: Group, stage: Stage) -> Group:
        """Take only the submitting stage's part: a worker cannot rewrite what earlier stages made."""
        if stage is Stage.ROLLOUT:
            return Group(prompt=entry.prompt, version=group.version, samples=group.samples)
        assert entry.group is not None
        part = _PART[stage]
        assert part is not None
        return Group(**{**entry.group.model_dump(), part: getattr(group, part)})

    def _admit(self, items: Iterable[PromptItem]) -> tuple[int, int, int]:
        added: list[int] = []
        held = refused = 0
        for item in sorted(items, key=lambda i: i.position):
            known = self._entries.get(item.position)
            if item.position < self.watermark:
                refused += 1
            elif known is not None:
                if known.prompt.sample_id != item.sample_id or known.prompt.step != item.step:
                    raise RelayError(
                        f"position {item.position} is held for sample {known.prompt.sample_id} of step "
                        f"{known.prompt.step}, now demanded as sample {item.sample_id} of step {item.step}"
                    )
                held += 1
            else:
                self._entries[item.position] = _Entry(prompt=item)
                added.append(item.position)
        over = len(self._entries) - self.settings.relay_capacity
        if over > 0:  # keep the lowest positions: the actor needs them first
            fresh = set(added)
            for position in sorted(self._entries, reverse=True)[:over]:
                self._remove(position)
                self.counts["refused" if position in fresh else "evicted"] += 1
        kept = sum(1 for p in added if p in self._entries)
        self.counts["demanded"] += kept
        return kept, held, refused + len(added) - kept

    def _drop_below(self, watermark: int) -> None:
        for position in [p for p in self._entries if p < watermark]:
            self._remove(position)

    def _remove(self, position: int) -> None:
        entry = self._entries.pop(position)
        self._unlease(entry)

    def _unlease(self, entry: _Entry) -> None:
        if entry.lease_id is not None and (lease := self._leases.get(entry.lease_id)) is not None:
            lease.positions.discard(entry.prompt.position)
        entry.lease_id = None

    def _reset(self, entry: _Entry, stage: Stage) -> None:
        self._unlease(entry)
        entry.stage = stage
        if stage is Stage.ROLLOUT:
            entry.group = None

    def _end_lease(self, lease_id: str, why: str) -> int:
        lease = self._leases.pop(lease_id)
        n = 0
        for position in lease.positions:
            entry = self._entries.get(position)
            if entry is not None and entry.lease_id == lease_id:
                entry.lease_id = None
                n += 1
        self.counts[f"{why}.{lease.stage.value}"] += n
        if why == "expired" and n:
            self.expired_at[lease.client.split("#", 1)[0]] = time.time()  # wall time: the controller reads it
        return n

    def _expire(self) -> None:
        """End leases past their deadline (a hung worker), and leases left holding nothing."""
        now = self._clock()
        ended = [i for i, lease in self._leases.items() if lease.deadline < now or not lease.positions]
        for lease_id in ended:
            self._end_lease(lease_id, "expired")
        if ended:
            self._cond.notify_all()


_NEXT = {Stage.ROLLOUT: Stage.REWARD, Stage.REWARD: Stage.REFERENCE, Stage.REFERENCE: Stage.READY}
_PART: dict[Stage, str | None] = {Stage.ROLLOUT: None, Stage.REWARD: "rewards", Stage.REFERENCE: "ref_logprobs"}
