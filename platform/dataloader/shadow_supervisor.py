"""Starts the node's shadow loader process, restarts it when it dies, and owns its shared memory.

The node agent (or a test) holds one supervisor per job and node. The segment outlives every loader
process and every trainer restart; it goes when the supervisor closes (or, if the supervisor itself
was killed, when the next supervisor or remove_stale_segments() finds its owner dead).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from stalwart.dataloader.config import DataConfig
from stalwart.dataloader.dataset import TokenDataset
from stalwart.dataloader.doorbell import bell_path, ring
from stalwart.dataloader.dp_slice import check_dp
from stalwart.dataloader.errors import DataError
from stalwart.dataloader.liveness import alive
from stalwart.dataloader.shm_layout import COUNT_MASK, A, C, H, S, Segment, segment_name
from stalwart.dataloader.state import LoaderState, check_state
from stalwart.logs import get_logger
from stalwart.processes import ChildProcess, spawn, stop_process

_QUICK_DEATH = 2.0  # a loader that dies sooner than this is backed off before the next start
_MAX_BACKOFF = 5.0
LOADER_MODULE = "stalwart.dataloader.shadow_process"

# A faster way to start the loader, `python -m module args` writing to a log file, than a new
# interpreter (the node agent forks it from its fork server); None from it: start it here.
ForkLoader = Callable[[str, list[str], Path], ChildProcess | None]


class ShadowLoaderSupervisor:
    def __init__(
        self,
        config: DataConfig,
        *,
        job: str,
        node: str,
        lanes: int,
        max_micro_batch: int,
        slots: int = 8,
        log_path: str | Path | None = None,
        poll_interval: float = 0.1,
        fork: ForkLoader | None = None,
    ) -> None:
        """With `log_path`, the loader writes there (else to this process's stderr), and may be
        started by `fork`."""
        self.config = config
        self.fork = fork
        self.name = segment_name(job, node)
        self.lanes, self.max_micro_batch, self.slots = lanes, max_micro_batch, slots
        self.log_path = Path(log_path) if log_path else None
        self.poll_interval = poll_interval
        self.restarts = 0
        self.forked = False  # the running loader came from `fork`
        self.segment: Segment | None = None
        self._proc: ChildProcess | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._started_at = 0.0
        self._backoff = 0.0
        self._log_ctx = get_logger("stalwart.dataloader.shadow", job=job, node=node)

    # ------------------------------------------------------------------------------- lifecycle
    def start(self, *, watch: bool = True) -> ShadowLoaderSupervisor:
        """Create the segment, start the loader, and (with watch) a thread that restarts it on death."""
        TokenDataset(self.config).close()  # bad shards fail here, in the caller, with the file named
        self.segment = Segment.create(
            self.name,
            config_json=self.config.dumps(),
            lanes=self.lanes,
            slots=self.slots,
            max_micro=self.max_micro_batch,
            sample_tokens=self.config.seq_len + 1,
        )
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")
        self._spawn()
        if watch:
            self._watcher = threading.Thread(target=self._watch, name=f"shadow-loader-{self.name}", daemon=True)
            self._watcher.start()
        return self

    def _spawn(self) -> None:
        args = ["--segment", self.name]
        forked = self.fork(LOADER_MODULE, args, self.log_path) if self.fork and self.log_path else None
        self.forked = forked is not None
        self._proc = forked or spawn(
            [sys.executable, "-m", LOADER_MODULE, *args],
            stdout=self._log or subprocess.DEVNULL,
            stderr=self._log,
            die_with_parent=True,
        )
        self._started_at = time.monotonic()

    def check(self) -> bool:
        """Restart the loader if it has exited; True if it did. Safe to call from any thread."""
        with self._lock:
            if self._proc is None or self._proc.poll() is None or self._stop.is_set():
                return False
            code = self._proc.returncode
            lived = time.monotonic() - self._started_at
            self._backoff = 0.0 if lived > _QUICK_DEATH else min(max(self._backoff * 2, 0.1), _MAX_BACKOFF)
            self._log_ctx.warning(
                "shadow loader exited; restarting",
                fields={"exit_code": code, "lived_s": round(lived, 2), "backoff_s": self._backoff},
            )
            if self._backoff and self._stop.wait(self._backoff):
                return False
            self._spawn()
            self.restarts += 1
            return True

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_interval):
            self.check()

    def close(self) -> None:
        """Stop the loader and remove the segment. Idempotent."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
            self._watcher = None
        with self._lock:
            if self._proc is not None:
                stop_process(self._proc, grace=2.0)
                self._proc = None
        if self.segment is not None:
            self.segment.close()
            self.segment.unlink()
            self.segment = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ShadowLoaderSupervisor:
        return self.start() if self.segment is None else self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---------------------------------------------------------------------------------- status
    @property
    def loader_pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def heartbeat(self) -> int:
        return int(self.segment.header[H.HEARTBEAT]) if self.segment is not None else 0

    def produced(self, lane: int) -> int:
        """Batches the loader has written into the lane (all generations): for metrics and tests."""
        assert self.segment is not None
        return int(self.segment.lanes[lane].ctrl[A.PRODUCED])

    def ready_batches(self, lane: int) -> int:
        """Batches of the lane's active request written and not yet taken by its trainer: how far the
        loader is ahead (0 while the trainer waits on it, or before any request). For metrics."""
        if self.segment is None:
            return 0
        view = self.segment.lanes[lane]
        gen = int(view.ctrl[A.GEN])
        if gen == 0:
            return 0
        taken = int(view.ctrl[C.CONSUMED]) & COUNT_MASK
        return sum(
            1
            for slot in view.slots
            if int(slot.header[S.STATUS]) == S.READY
            and int(slot.header[S.GEN]) == gen
            and int(slot.header[S.K]) >= taken
        )

    # ---------------------------------------------------------------------------------- prewarm
    def prewarm(
        self,
        state: LoaderState | Mapping[str, Any],
        *,
        dp_size: int,
        micro_batch: int,
        dp_ranks: Sequence[int] | None = None,
    ) -> None:
        """Have the loader compute, from a saved state, the batches that the trainers of this node will
        ask for (lane i serves data-parallel rank dp_ranks[i]): a warm standby is ready on arrival."""
        assert self.segment is not None, "start() the supervisor first"
        loaded = LoaderState.coerce(state)
        dataset = TokenDataset(self.config)
        try:
            check_state(dataset, loaded)
        finally:
            dataset.close()
        ranks = list(dp_ranks) if dp_ranks is not None else list(range(self.lanes))
        if len(ranks) > self.lanes:
            raise ValueError(f"{len(ranks)} ranks for {self.lanes} lanes")
        if micro_batch > self.max_micro_batch:
            raise ValueError(f"micro batch {micro_batch} exceeds the segment's {self.max_micro_batch}")
        for lane_index, rank in enumerate(ranks):
            check_dp(rank, dp_size, micro_batch)
            c = self.segment.lanes[lane_index].ctrl
            if alive(int(c[A.OWNER_PID]), int(c[A.OWNER_START])):
                raise DataError(f"lane {lane_index} is in use by a live trainer (pid {int(c[A.OWNER_PID])})")
            # A trainer that has asked but not yet been answered (a starved loader) owns the lane too:
            # prewarming over its request would take the lane from under it.
            pending = int(c[C.REQ_SEQ]) != int(c[A.HANDLED_SEQ])
            if pending and alive(int(c[C.CLIENT_PID]), int(c[C.CLIENT_START])):
                raise DataError(f"lane {lane_index} is in use by a live trainer (pid {int(c[C.CLIENT_PID])})")
            seq = max(int(c[C.REQ_SEQ]), int(c[A.HANDLED_SEQ])) + 1
            c[C.REQ_POSITION], c[C.REQ_RANK] = loaded.position, rank
            c[C.REQ_SIZE], c[C.REQ_MICRO] = dp_size, micro_batch
            c[C.CLIENT_PID], c[C.CLIENT_START] = 0, 0
            c[C.RESUME_POSITION] = loaded.position + 1
            c[C.CONSUMED] = seq << 32
            c[C.REQ_SEQ] = seq
            ring(bell_path(self.segment.path))
