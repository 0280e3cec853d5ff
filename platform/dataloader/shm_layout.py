"""The shadow loader's shared-memory segment: one file in /dev/shm, owned by the supervisor.

    header   64 x u64 words (H.*)                        offset 0
    config   the DataConfig as JSON                      offset 512
    lanes    one per local trainer rank, each:           offset H.LANES_OFFSET (4 KiB aligned)
               control  64 x u64 words (C.* written by the client, A.* by the loader)
               error    1 KiB of UTF-8: why the loader cannot produce the active request
               slots    a ring of H.SLOTS slots, each:
                          header 8 x u64 (S.*): seqlock version, status, gen, k, position, count, crc
                          sample ids   int64[max_micro_batch]
                          tokens       int32[max_micro_batch, seq_len + 1]

Every word has exactly one writer (client, loader or, before a client exists, the supervisor), so
no locks are needed; slots use a seqlock and a CRC, so a reader never accepts a half-written batch.
The name is derived from (job, node), unique per node; a segment whose owner died is reclaimed.
"""

from __future__ import annotations

import mmap
import os
import re
import time
import zlib
from pathlib import Path

import numpy as np

from stalwart.dataloader.doorbell import SUFFIX as BELL_SUFFIX
from stalwart.dataloader.doorbell import bell_path
from stalwart.dataloader.errors import DataError
from stalwart.dataloader.liveness import alive, start_ms
from stalwart.worker_contract import DATALOADER_SHM

SHM_DIR_ENV = "STALWART_SHM_DIR"
SHM_ENV = DATALOADER_SHM  # the segment's name, set for workers by whoever runs the loader (the agent)
NAME_PREFIX = "stalwart-dl."
MAGIC = 0x31304C4453545753  # "SWTSDL01"
LAYOUT_VERSION = 1
HEADER_WORDS = 64
CONFIG_OFFSET = 512
CTRL_WORDS = 64
ERROR_BYTES = 1024
SLOT_HEADER_WORDS = 8
FATAL_GEN = (1 << 64) - 1  # an ERROR_GEN meaning: this loader cannot serve anything (e.g. unreadable shards)
COUNT_MASK = (1 << 32) - 1  # C.CONSUMED holds (request sequence << 32) | batches taken


class H:
    """Segment header words."""

    MAGIC, VERSION, LANES, SLOTS, MAX_MICRO, SAMPLE_TOKENS = 0, 1, 2, 3, 4, 5
    OWNER_PID, OWNER_START, LOADER_PID, HEARTBEAT, INCARNATION = 6, 7, 8, 9, 10
    CONFIG_LEN, LANES_OFFSET, LANE_BYTES, SLOT_BYTES = 11, 12, 13, 14


class C:
    """Lane control words written by the client (or the supervisor's prewarm, when no client is there)."""

    REQ_SEQ, REQ_POSITION, REQ_RANK, REQ_SIZE, REQ_MICRO, CLIENT_PID, CLIENT_START = 0, 1, 2, 3, 4, 5, 6
    RESUME_POSITION = 7  # position + 1 of the client's latest state_dict (0: none): where a restart resumes
    CONSUMED = 8  # (REQ_SEQ << 32) | batches the client has taken since that request
    RELEASED_SEQ = 9  # the client closed its request with this sequence number


class A:
    """Lane control words written by the loader: the active request (a 'generation')."""

    GEN, HANDLED_SEQ, REQ_SEQ, POSITION, RANK, SIZE, MICRO, OWNER_PID, OWNER_START = 16, 17, 18, 19, 20, 21, 22, 23, 24
    ERROR_GEN, ERROR_LEN, PRODUCED = 25, 26, 27


class S:
    """Slot header words."""

    VERSION, STATUS, GEN, K, POSITION, COUNT, CRC = 0, 1, 2, 3, 4, 5, 6
    READY = 1


def batch_crc(ids: np.ndarray, tokens: np.ndarray) -> int:
    """The slot checksum over sample ids and tokens: a reader never accepts a torn batch."""
    return zlib.crc32(tokens.data, zlib.crc32(ids.data))


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def shm_dir() -> Path:
    return Path(os.environ.get(SHM_DIR_ENV, "/dev/shm"))


def segment_name(job: str, node: str) -> str:
    """The segment name for one job on one node (unique per job/node, safe as a file name)."""
    clean = lambda s: re.sub(r"[^A-Za-z0-9_-]", "_", s)[:80]  # noqa: E731
    return f"{NAME_PREFIX}{clean(job)}.{clean(node)}"


class SlotView:
    def __init__(self, buf: mmap.mmap, offset: int, max_micro: int, sample_tokens: int) -> None:
        self.header = np.frombuffer(buf, np.uint64, SLOT_HEADER_WORDS, offset)
        offset += SLOT_HEADER_WORDS * 8
        self.ids = np.frombuffer(buf, np.int64, max_micro, offset)
        offset += 8 * max_micro
        self.tokens = np.frombuffer(buf, np.int32, max_micro * sample_tokens, offset).reshape(max_micro, sample_tokens)


class LaneView:
    def __init__(
        self, buf: mmap.mmap, offset: int, slots: int, slot_bytes: int, max_micro: int, sample_tokens: int
    ) -> None:
        self.ctrl = np.frombuffer(buf, np.uint64, CTRL_WORDS, offset)
        self.error = np.frombuffer(buf, np.uint8, ERROR_BYTES, offset + CTRL_WORDS * 8)
        first = offset + CTRL_WORDS * 8 + ERROR_BYTES
        self.slots = [SlotView(buf, first + j * slot_bytes, max_micro, sample_tokens) for j in range(slots)]

    def set_error(self, gen: int, message: str) -> None:
        raw = message.encode("utf-8", errors="replace")[:ERROR_BYTES]
        self.error[: len(raw)] = np.frombuffer(raw, np.uint8)
        self.ctrl[A.ERROR_LEN] = len(raw)
        self.ctrl[A.ERROR_GEN] = gen

    def error_text(self) -> str:
        return bytes(self.error[: int(self.ctrl[A.ERROR_LEN])]).decode("utf-8", errors="replace")


class Segment:
    def __init__(self, name: str, fd: int, mm: mmap.mmap, owner: bool) -> None:
        self.name, self.path, self._mm, self.owner = name, shm_dir() / name, mm, owner
        os.close(fd)
        buf = mm
        self.header = np.frombuffer(buf, np.uint64, HEADER_WORDS, 0)
        if int(self.header[H.MAGIC]) != MAGIC or int(self.header[H.VERSION]) != LAYOUT_VERSION:
            raise DataError(f"{self.path}: not a Stalwart shadow-loader segment (or another layout version)")
        h = self.header
        self.n_lanes, self.n_slots = int(h[H.LANES]), int(h[H.SLOTS])
        self.max_micro, self.sample_tokens = int(h[H.MAX_MICRO]), int(h[H.SAMPLE_TOKENS])
        self.lanes = [
            LaneView(
                buf,
                int(h[H.LANES_OFFSET]) + i * int(h[H.LANE_BYTES]),
                self.n_slots,
                int(h[H.SLOT_BYTES]),
                self.max_micro,
                self.sample_tokens,
            )
            for i in range(self.n_lanes)
        ]

    @staticmethod
    def sizes(lanes: int, slots: int, max_micro: int, sample_tokens: int, config_len: int) -> tuple[int, int, int, int]:
        slot_bytes = _align(SLOT_HEADER_WORDS * 8 + 8 * max_micro + 4 * max_micro * sample_tokens, 64)
        lane_bytes = _align(CTRL_WORDS * 8 + ERROR_BYTES + slots * slot_bytes, 4096)
        lanes_offset = _align(CONFIG_OFFSET + config_len, 4096)
        return slot_bytes, lane_bytes, lanes_offset, lanes_offset + lanes * lane_bytes

    @classmethod
    def create(
        cls, name: str, *, config_json: str, lanes: int, slots: int, max_micro: int, sample_tokens: int
    ) -> Segment:
        """Create the segment (reclaiming a stale one whose owner is dead); this process owns it."""
        if lanes < 1 or slots < 2 or max_micro < 1:
            raise ValueError("need lanes >= 1, slots >= 2, max_micro >= 1")
        path = shm_dir() / name
        path.parent.mkdir(parents=True, exist_ok=True)  # a STALWART_SHM_DIR of its own, like a workdir
        if path.exists():
            try:
                stale = cls.attach(name)
                owner_alive = alive(int(stale.header[H.OWNER_PID]), int(stale.header[H.OWNER_START]))
                stale.close()
            except (DataError, ValueError, OSError):
                owner_alive = False
            if owner_alive:
                raise DataError(f"{path}: shadow-loader segment is in use by a live supervisor")
            path.unlink(missing_ok=True)
        raw = config_json.encode()
        slot_bytes, lane_bytes, lanes_offset, total = cls.sizes(lanes, slots, max_micro, sample_tokens, len(raw))
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, total)
            mm = mmap.mmap(fd, total)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        mm[CONFIG_OFFSET : CONFIG_OFFSET + len(raw)] = raw
        h = np.frombuffer(mm, np.uint64, HEADER_WORDS, 0)
        values = {
            H.VERSION: LAYOUT_VERSION,
            H.LANES: lanes,
            H.SLOTS: slots,
            H.MAX_MICRO: max_micro,
            H.SAMPLE_TOKENS: sample_tokens,
            H.OWNER_PID: os.getpid(),
            H.OWNER_START: start_ms(os.getpid()),
            H.CONFIG_LEN: len(raw),
            H.LANES_OFFSET: lanes_offset,
            H.LANE_BYTES: lane_bytes,
            H.SLOT_BYTES: slot_bytes,
        }
        for word, value in values.items():
            h[word] = value
        h[H.MAGIC] = MAGIC  # last: a reader never sees a half-initialized header as valid
        del h
        return cls(name, fd, mm, owner=True)

    @classmethod
    def attach(cls, name: str) -> Segment:
        path = shm_dir() / name
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise DataError(f"{path}: no shadow-loader segment (is the shadow loader's supervisor running?)") from None
        size = os.fstat(fd).st_size
        if size < CONFIG_OFFSET:
            os.close(fd)
            raise DataError(f"{path}: shadow-loader segment is truncated ({size} bytes)")
        return cls(name, fd, mmap.mmap(fd, size), owner=False)

    def config_json(self) -> str:
        n = int(self.header[H.CONFIG_LEN])
        return bytes(self._mm[CONFIG_OFFSET : CONFIG_OFFSET + n]).decode()

    def owner_alive(self) -> bool:
        return alive(int(self.header[H.OWNER_PID]), int(self.header[H.OWNER_START]))

    def close(self) -> None:
        """Unmap (the views die with this object); the owner also removes the segment's name."""
        self.header = None  # type: ignore[assignment]
        self.lanes = []
        try:
            self._mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes when it does

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)
        bell_path(self.path).unlink(missing_ok=True)  # the loader's doorbell, made beside it


def remove_stale_segments() -> list[str]:
    """Remove shadow-loader segments whose supervisor is dead (e.g. after a node agent was SIGKILLed)."""
    removed = []
    for path in shm_dir().glob(NAME_PREFIX + "*"):
        if path.name.endswith(BELL_SUFFIX):
            if not path.with_name(path.name.removesuffix(BELL_SUFFIX)).exists():
                path.unlink(missing_ok=True)  # its segment is gone: so is its loader
            continue
        try:
            seg = Segment.attach(path.name)
            dead = not seg.owner_alive()
            seg.close()
        except (DataError, ValueError, OSError):
            # unreadable: garbage, or a segment being created right now (give that a minute)
            try:
                dead = time.time() - path.stat().st_mtime > 60
            except FileNotFoundError:
                continue
        if dead:
            path.unlink(missing_ok=True)
            bell_path(path).unlink(missing_ok=True)
            removed.append(path.name)
    return removed
