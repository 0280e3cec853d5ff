"""The shadow loader process: `python -m stalwart.dataloader.shadow_process --segment NAME`.

One per node, beside the trainer's workers. For each lane (a local trainer rank) it fills a ring of
shared-memory slots with the batches that follow the lane's active request, up to the ring's size
ahead of what the trainer has taken. It keeps all of its state in the segment, so a restarted loader
carries on where the crashed one stopped; a batch already in a slot is not computed again.

When a lane's trainer dies (or closes), the lane is re-armed at the trainer's last published state
(its last checkpoint): the batches a restarted trainer will ask for are computed while it restarts.
A supervisor's prewarm does the same for a warm standby. Adoption is exact: a new request takes over
the prefilled batches only if it asks for exactly that position and data-parallel layout.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType

from stalwart.dataloader.config import DataConfig
from stalwart.dataloader.dataset import TokenDataset
from stalwart.dataloader.doorbell import Doorbell, bell_path
from stalwart.dataloader.dp_slice import rank_positions
from stalwart.dataloader.errors import DataError
from stalwart.dataloader.liveness import alive
from stalwart.dataloader.shm_layout import COUNT_MASK, FATAL_GEN, A, C, H, LaneView, S, Segment, batch_crc
from stalwart.logs import configure, get_logger

OWNER_CHECK_INTERVAL = 0.1  # a trainer that died is noticed this late; one that closed rings
# With nothing to do, the loop sleeps on its doorbell (stalwart.dataloader.doorbell), which every
# client rings after it changes the segment, until it rings or the owner check is due. Where the
# doorbell cannot be made, it polls instead, sleeping longer each round up to 10 ms (about 2% of a
# core when idle, where the doorbell takes a fifth of that).
IDLE_SLEEP_MIN, IDLE_SLEEP_MAX = 0.0002, 0.01


class LaneServer:
    """Serves one lane. Stateless between calls: everything it needs is in the segment."""

    def __init__(self, segment: Segment, index: int, dataset: TokenDataset) -> None:
        self.lane: LaneView = segment.lanes[index]
        self.max_micro = segment.max_micro
        self.dataset = dataset

    def _activate(self, position: int, rank: int, size: int, micro: int, owner: tuple[int, int], seq: int) -> None:
        c = self.lane.ctrl
        gen = int(c[A.GEN]) + 1
        c[A.POSITION], c[A.RANK], c[A.SIZE], c[A.MICRO] = position, rank, size, micro
        c[A.OWNER_PID], c[A.OWNER_START] = owner
        c[A.GEN] = gen
        if not (micro <= self.max_micro and size >= 1 and 0 <= rank < size and micro >= 1):
            self.lane.set_error(
                gen,
                f"bad request: rank {rank} of {size}, micro batch {micro} "
                f"(this segment holds at most {self.max_micro} samples per slot)",
            )
        c[A.REQ_SEQ] = seq  # last: the client reads GEN once it sees its sequence number here

    def poll_request(self) -> bool:
        """Answer a new request: adopt the prefilled generation if it matches exactly, else start anew."""
        c = self.lane.ctrl
        seq = int(c[C.REQ_SEQ])
        if seq == int(c[A.HANDLED_SEQ]):
            return False
        req = (int(c[C.REQ_POSITION]), int(c[C.REQ_RANK]), int(c[C.REQ_SIZE]), int(c[C.REQ_MICRO]))
        owner: tuple[int, int] = (int(c[C.CLIENT_PID]), int(c[C.CLIENT_START]))
        if int(c[C.REQ_SEQ]) != seq:
            return True  # being rewritten; read it again next round
        gen = int(c[A.GEN])
        active = (int(c[A.POSITION]), int(c[A.RANK]), int(c[A.SIZE]), int(c[A.MICRO]))
        unowned = int(c[A.OWNER_PID]) == 0 or not alive(int(c[A.OWNER_PID]), int(c[A.OWNER_START]))
        if gen > 0 and active == req and unowned and int(c[A.ERROR_GEN]) != gen:
            c[A.OWNER_PID], c[A.OWNER_START] = owner
            c[A.REQ_SEQ] = seq
        else:
            self._activate(*req, owner=owner, seq=seq)
        c[A.HANDLED_SEQ] = seq
        return True

    def check_owner(self) -> bool:
        """Re-arm at the trainer's last published position once it has died or let go."""
        c = self.lane.ctrl
        owner = int(c[A.OWNER_PID])
        if int(c[A.GEN]) == 0 or owner == 0:
            return False
        released = int(c[C.RELEASED_SEQ]) == int(c[A.REQ_SEQ]) != 0
        if not released and alive(owner, int(c[A.OWNER_START])):
            return False
        resume = int(c[C.RESUME_POSITION])
        position = resume - 1 if resume else int(c[A.POSITION])
        self._activate(position, int(c[A.RANK]), int(c[A.SIZE]), int(c[A.MICRO]), owner=(0, 0), seq=0)
        return True

    def produce(self) -> bool:
        """Fill the first slot in the window [consumed, consumed + slots) that lacks its batch."""
        c = self.lane.ctrl
        gen = int(c[A.GEN])
        if gen == 0 or int(c[A.ERROR_GEN]) in (gen, FATAL_GEN):
            return False
        word, req_seq = int(c[C.CONSUMED]), int(c[A.REQ_SEQ])
        consumed = word & COUNT_MASK if req_seq and word >> 32 == req_seq else 0
        slots = self.lane.slots
        for k in range(consumed, consumed + len(slots)):
            h = slots[k % len(slots)].header
            if int(h[S.VERSION]) % 2 == 0 and int(h[S.STATUS]) == S.READY and int(h[S.GEN]) == gen and int(h[S.K]) == k:
                continue
            self._write(k, gen)
            return True
        return False

    def _write(self, k: int, gen: int) -> None:
        c = self.lane.ctrl
        slot = self.lane.slots[k % len(self.lane.slots)]
        h = slot.header
        v = int(h[S.VERSION])
        h[S.VERSION] = v + 1 if v % 2 == 0 else v + 2  # odd: being written
        h[S.STATUS] = 0
        rank, size, micro = int(c[A.RANK]), int(c[A.SIZE]), int(c[A.MICRO])
        position = int(c[A.POSITION]) + k * size * micro
        try:
            _, ids = self.dataset.fetch(rank_positions(position, rank, size, micro), out=slot.tokens[:micro])
        except DataError as exc:
            self.lane.set_error(gen, str(exc))
            h[S.VERSION] = int(h[S.VERSION]) + 1
            return
        slot.ids[:micro] = ids
        h[S.GEN], h[S.K], h[S.POSITION], h[S.COUNT] = gen, k, position, micro
        h[S.CRC] = batch_crc(slot.ids[:micro], slot.tokens[:micro])
        h[S.STATUS] = S.READY
        h[S.VERSION] = int(h[S.VERSION]) + 1  # even: complete
        c[A.PRODUCED] = int(c[A.PRODUCED]) + 1


def serve(segment: Segment, should_stop: Callable[[], bool]) -> None:
    """The loader's loop: requests first, then owner checks, then one batch per lane per round."""
    header = segment.header
    try:
        dataset = TokenDataset(DataConfig.loads(segment.config_json()))
    except DataError as exc:
        for lane in segment.lanes:
            lane.set_error(FATAL_GEN, str(exc))
        dataset = None
    servers = [LaneServer(segment, i, dataset) for i in range(segment.n_lanes)] if dataset else []
    try:
        bell: Doorbell | None = Doorbell(bell_path(segment.path))
    except OSError as exc:
        log = get_logger("stalwart.dataloader.shadow_process", segment=segment.name)
        log.warning("no doorbell: polling instead", fields={"error": str(exc)})
        bell = None
    idle = IDLE_SLEEP_MIN
    next_owner_check = 0.0
    while not should_stop():
        worked = False
        for server in servers:
            worked |= server.poll_request()
        if time.monotonic() >= next_owner_check:
            next_owner_check = time.monotonic() + OWNER_CHECK_INTERVAL
            if not segment.owner_alive():
                break  # the supervisor is gone; so is the segment's reason to exist
            for server in servers:
                worked |= server.check_owner()
        for server in servers:
            worked |= server.produce()
        header[H.HEARTBEAT] = int(header[H.HEARTBEAT]) + 1
        if worked:
            idle = IDLE_SLEEP_MIN
        elif bell is not None:
            bell.wait(max(0.0, next_owner_check - time.monotonic()))
        else:
            time.sleep(idle)
            idle = min(idle * 2, IDLE_SLEEP_MAX)
    if bell is not None:
        bell.close()
    if dataset is not None:
        dataset.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stalwart.dataloader.shadow_process", description=__doc__)
    parser.add_argument("--segment", required=True, help="shared-memory segment name (created by the supervisor)")
    args = parser.parse_args(argv)
    stopping = False

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    configure("WARNING")  # JSON lines on stderr: the supervisor's log_path, or its own stderr
    segment = Segment.attach(args.segment)
    segment.header[H.LOADER_PID] = os.getpid()
    segment.header[H.INCARNATION] = int(segment.header[H.INCARNATION]) + 1
    serve(segment, lambda: stopping)
    return 0


if __name__ == "__main__":
    sys.exit(main())
