"""The diagnosis service's bounds on heavy work: a few worker processes, and admission to them.

`Admission` lets `slots` requests work at once and `queue` more wait (up to `wait_seconds`) for a
slot; anything past that is turned away at once (the service answers 503 with Retry-After), before
its body is read. `WorkerPool` runs the admitted work in `size` processes (spawned, not forked: the
service has threads), each capped in memory; one that dies is replaced with its pool.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from stalwart.diagnosis import bundle_worker

T = TypeVar("T")


class Busy(RuntimeError):
    """Every slot is taken and the queue is full (or the wait ran out): come back later."""


class WorkerLost(RuntimeError):
    """The worker process died under the request (killed, out of memory): the pool was replaced."""


class Admission:
    def __init__(self, slots: int, queue: int, wait_seconds: float) -> None:
        self.slots = slots
        self.queue = queue
        self.wait_seconds = wait_seconds
        self._free = asyncio.Semaphore(slots)
        self.waiting = 0
        self.working = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._free.locked() and self.waiting >= self.queue:
            raise Busy(f"{self.slots} bundles are being diagnosed and {self.waiting} are waiting")
        self.waiting += 1
        try:
            await asyncio.wait_for(self._free.acquire(), self.wait_seconds)
        except TimeoutError:
            raise Busy(f"no diagnosis worker was free within {self.wait_seconds:g}s") from None
        finally:
            self.waiting -= 1
        self.working += 1
        try:
            yield
        finally:
            self.working -= 1
            self._free.release()


class WorkerPool:
    def __init__(self, size: int, memory_limit_bytes: int) -> None:
        self.size = size
        self.memory_limit_bytes = memory_limit_bytes
        self._executor: ProcessPoolExecutor | None = None

    def _start(self) -> None:
        """Workers are spawned by the event loop's thread (each dies with the thread that started
        it): one at the start (`warm`), the others as bundles arrive."""
        self._executor = ProcessPoolExecutor(
            self.size,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=bundle_worker.init_worker,
            initargs=(self.memory_limit_bytes,),
        )

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            self._start()
        executor = self._executor
        assert executor is not None
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
        except BrokenProcessPool:
            if self._executor is executor:  # the first request to notice replaces the pool
                executor.shutdown(wait=False, cancel_futures=True)
                self._start()
            raise WorkerLost("a diagnosis worker died while working on this request") from None

    async def warm(self) -> None:
        """One worker started before the first bundle. Spawning it imports the engine, half a
        CPU-second at low priority: seconds on a machine busy with training. The first failure's
        diagnosis, which a recovery waits for, paid that (0.6 s against 0.04 s for the next, on a
        quiet machine); now the service's start pays it, once."""
        try:
            await self.run(bundle_worker.ready)
        except WorkerLost:
            pass  # the next bundle starts a new pool, as after any lost worker

    def stop(self) -> None:
        if self._executor is not None:
            processes = list((getattr(self._executor, "_processes", None) or {}).values())
            self._executor.shutdown(wait=False, cancel_futures=True)
            for proc in processes:  # a worker in the middle of a bundle would hold the shutdown up
                if proc.is_alive():
                    proc.kill()
            self._executor = None
