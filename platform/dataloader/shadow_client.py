"""The trainer's side of the shadow loader: an iterator over this rank's batches, served from shared
memory, with the same state_dict/load_state_dict as the in-process loader.

Every batch is checked before it is returned: the slot's seqlock and CRC (no torn read) and its
sample ids against the global order (no wrong or skipped sample, ever). If the loader is down
(crashed, restarting), the client waits; after `fallback_after` seconds it computes the batch itself
(same pure function, same result) unless local fallback is off, in which case it waits up to
`wait_timeout` and then raises ShadowLoaderUnavailable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from stalwart.dataloader.batch import Batch, ServedBy
from stalwart.dataloader.config import DataConfig
from stalwart.dataloader.dataset import TokenDataset
from stalwart.dataloader.doorbell import bell_path, ring
from stalwart.dataloader.dp_slice import check_dp, rank_positions
from stalwart.dataloader.errors import DataError, ShadowLoaderUnavailable
from stalwart.dataloader.liveness import start_ms
from stalwart.dataloader.shm_layout import COUNT_MASK, FATAL_GEN, A, C, H, S, Segment, batch_crc
from stalwart.dataloader.state import LoaderState, check_state, delta_at, state_at

_POLL_MIN, _POLL_MAX = 0.0001, 0.002


@dataclass
class ClientStats:
    shadow: int = 0  # batches served from shared memory
    local: int = 0  # batches computed in this process because the loader was not there
    ready_on_arrival: int = 0  # shadow batches already in their slot at the first look
    wait_s: float = 0.0  # total time spent waiting for the loader
    requests: int = 0
    adopted: int = 0  # requests answered with batches the loader had prefilled (restart, standby)


class ShadowLoaderClient:
    def __init__(
        self,
        shm_name: str,
        *,
        lane: int,
        dp_rank: int,
        dp_size: int,
        micro_batch: int,
        config: DataConfig | None = None,
        local_fallback: bool = True,
        fallback_after: float = 5.0,
        wait_timeout: float = 120.0,
    ) -> None:
        check_dp(dp_rank, dp_size, micro_batch)
        self.segment = Segment.attach(shm_name)
        try:
            seg_config = DataConfig.loads(self.segment.config_json())
            if config is not None and config != seg_config:
                raise DataError(f"shadow loader {shm_name} serves a different data config than this trainer's")
            if not 0 <= lane < self.segment.n_lanes:
                raise ValueError(f"lane {lane} out of range: segment {shm_name} has {self.segment.n_lanes} lanes")
            if micro_batch > self.segment.max_micro:
                raise ValueError(f"micro batch {micro_batch} exceeds the segment's {self.segment.max_micro}")
            self.config = seg_config
            self.dataset = TokenDataset(seg_config)
        except BaseException:
            self.segment.close()
            raise
        self.lane_index = lane
        self._lane = self.segment.lanes[lane]
        self._bell = bell_path(self.segment.path)
        self.dp_rank, self.dp_size, self.micro_batch = dp_rank, dp_size, micro_batch
        self.local_fallback, self.fallback_after, self.wait_timeout = local_fallback, fallback_after, wait_timeout
        self.position = 0
        self.stats = ClientStats()
        self._pid, self._start = os.getpid(), start_ms(os.getpid())
        self._seq = 0  # our request's sequence number; 0: none issued yet
        self._gen: int | None = None  # the loader's generation answering it, once acknowledged
        self._k = 0  # batches taken since the request
        self._down_heartbeat: int | None = None  # loader heartbeat when we last gave up waiting
        self._gen_before = 0
        self._req_position = 0
        self._adopted = False

    @property
    def global_batch(self) -> int:
        return self.dp_size * self.micro_batch

    # ----------------------------------------------------------------------------- requests
    def _request(self) -> None:
        """Ask the loader for the batches from self.position on (for this rank and layout)."""
        c = self._lane.ctrl
        seq = max(int(c[C.REQ_SEQ]), int(c[A.HANDLED_SEQ])) + 1
        self._gen_before = int(c[A.GEN])
        c[C.REQ_POSITION], c[C.REQ_RANK], c[C.REQ_SIZE], c[C.REQ_MICRO] = (
            self.position,
            self.dp_rank,
            self.dp_size,
            self.micro_batch,
        )
        c[C.CLIENT_PID], c[C.CLIENT_START] = self._pid, self._start
        c[C.RESUME_POSITION] = self.position + 1
        c[C.CONSUMED] = seq << 32
        c[C.REQ_SEQ] = seq  # last
        ring(self._bell)
        self._seq, self._gen, self._k, self._req_position = seq, None, 0, self.position
        self._adopted = False
        self.stats.requests += 1

    def _mark_adopted(self) -> None:
        if not self._adopted:
            self._adopted = True
            self.stats.adopted += 1

    def _prefilled_gen(self) -> int | None:
        """Before the acknowledgement: the lane's prefilled generation, if it is exactly our request.
        Reading its slots early is safe: every batch is checked against the global order anyway."""
        c = self._lane.ctrl
        gen = int(c[A.GEN])
        ours = (self._req_position, self.dp_rank, self.dp_size, self.micro_batch)
        active = tuple(int(c[w]) for w in (A.POSITION, A.RANK, A.SIZE, A.MICRO))
        unowned = int(c[A.OWNER_PID]) == 0
        if gen and int(c[A.GEN]) == gen and unowned and active == ours and int(c[A.ERROR_GEN]) != gen:
            return gen
        return None

    def _sync(self) -> None:
        """Pick up the loader's acknowledgement; re-request if our generation was taken away."""
        c = self._lane.ctrl
        if self._gen is None:
            if int(c[A.REQ_SEQ]) == self._seq:
                self._gen = int(c[A.GEN])
                if self._gen == self._gen_before:
                    self._mark_adopted()
                c[C.CONSUMED] = (self._seq << 32) | self._k  # batches we computed ourselves meanwhile
                ring(self._bell)
            elif int(c[A.HANDLED_SEQ]) >= self._seq:
                self._request()  # someone else wrote this lane's mailbox after us: ask again
        elif int(c[A.REQ_SEQ]) != self._seq:
            self._request()  # the loader re-armed the lane (it thought we were gone): ask again

    def _check_error(self) -> None:
        c = self._lane.ctrl
        err = int(c[A.ERROR_GEN])
        if err == FATAL_GEN or (self._gen is not None and err == self._gen):
            raise DataError(f"shadow loader: {self._lane.error_text()}")

    # -------------------------------------------------------------------------------- batches
    def _expected_ids(self, positions: np.ndarray) -> np.ndarray:
        return self.dataset.order.sample_ids(positions)

    def _try_slot(self, gen: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        slot = self._lane.slots[self._k % len(self._lane.slots)]
        h = slot.header
        v1 = int(h[S.VERSION])
        if v1 % 2 or int(h[S.STATUS]) != S.READY or int(h[S.GEN]) != gen or int(h[S.K]) != self._k:
            return None
        micro = self.micro_batch
        ids, tokens = slot.ids[:micro].copy(), slot.tokens[:micro].copy()
        crc, position = int(h[S.CRC]), int(h[S.POSITION])
        if int(h[S.VERSION]) != v1 or batch_crc(ids, tokens) != crc:
            return None  # overwritten while we copied: read it again
        if position != self.position or not np.array_equal(ids, self._expected_ids(positions)):
            if self._gen is None:
                return None  # a prefill that changed under us: wait for the loader's answer
            raise DataError(
                f"shadow loader served samples {ids.tolist()} at position {position}; "
                f"expected position {self.position} (a bug: refusing a wrong sample)"
            )
        return tokens, ids

    def next_batch(self) -> Batch:
        if self._seq == 0:
            self._request()
        positions = rank_positions(self.position, self.dp_rank, self.dp_size, self.micro_batch)
        heartbeat = int(self.segment.header[H.HEARTBEAT])
        # A loader that has not moved since we last gave up on it gets no new grace period.
        give_up_after = 0.0 if heartbeat == self._down_heartbeat else self.fallback_after
        if not self.local_fallback:
            give_up_after = self.wait_timeout
        t0 = time.monotonic()
        poll = _POLL_MIN
        first_look = True
        got: tuple[np.ndarray, np.ndarray] | None = None
        served: ServedBy = "shadow"
        while True:
            self._sync()
            self._check_error()
            gen = self._gen if self._gen is not None else self._prefilled_gen()
            if gen is not None:
                got = self._try_slot(gen, positions)
                if got is not None and self._gen is None:
                    self._mark_adopted()  # served from the prefill before the loader even answered
                if got is not None:
                    self.stats.ready_on_arrival += first_look
                    break
            first_look = False
            waited = time.monotonic() - t0
            if waited >= give_up_after:
                if not self.local_fallback:
                    raise ShadowLoaderUnavailable(
                        f"shadow loader {self.segment.name} lane {self.lane_index} delivered nothing for "
                        f"{waited:.1f}s (position {self.position})"
                    )
                self._down_heartbeat = int(self.segment.header[H.HEARTBEAT])
                got, served = self.dataset.fetch(positions), "local"
                break
            time.sleep(poll)
            poll = min(poll * 2, _POLL_MAX)
        self.stats.wait_s += time.monotonic() - t0
        tokens, ids = got
        batch = Batch(
            torch.from_numpy(tokens.astype(np.int64, copy=False)),
            torch.from_numpy(ids),
            self.position,
            self.dp_rank,
            self.dp_size,
            served,
        )
        if served == "shadow":
            self.stats.shadow += 1
            self._down_heartbeat = None
        else:
            self.stats.local += 1
        self._k += 1
        self.position += self.global_batch
        if self._gen is not None:
            self._lane.ctrl[C.CONSUMED] = (self._seq << 32) | (self._k & COUNT_MASK)
            ring(self._bell)  # a slot is free: the loader refills it now, not at its next owner check
        return batch

    def __iter__(self) -> ShadowLoaderClient:
        return self

    def __next__(self) -> Batch:
        return self.next_batch()

    # ---------------------------------------------------------------------------------- state
    def _publish(self) -> None:
        """Tell the loader where a restart of this trainer would resume (what it prefills if we die)."""
        self._lane.ctrl[C.RESUME_POSITION] = self.position + 1

    def state(self) -> LoaderState:
        return state_at(self.dataset, self.position)

    def state_dict(self) -> dict[str, Any]:
        self._publish()
        return self.state().model_dump()

    def state_delta(self) -> dict[str, Any]:
        self._publish()
        return delta_at(self.dataset, self.position).model_dump()

    def load_state_dict(self, state: LoaderState | Mapping[str, Any]) -> None:
        """Resume at the state's position; the request goes out now, so the loader works while we load the model."""
        loaded = LoaderState.coerce(state)
        check_state(self.dataset, loaded)
        self.position = loaded.position
        self._request()

    def close(self) -> None:
        """Let go of the lane (the loader re-arms it at our last published state) and unmap."""
        if self.segment.header is not None:
            if self._seq:
                self._lane.ctrl[C.RELEASED_SEQ] = self._seq
                ring(self._bell)
            del self._lane
            self.segment.close()
            self.dataset.close()
