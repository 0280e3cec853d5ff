"""The agent's pool of warm workers (stalwart.agents.warm_start): restarts skip the torch import.

The pool refills only once a generation has been running for a while, so that warming up the next
restart's workers never competes with the start of this one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from stalwart.agents.warm_start import LaunchRequest, warm_eligible
from stalwart.processes import spawn, stop_process

REFILL_DELAY_SECONDS = 3.0
# torch reads these when it is imported (TORCH_LOGS, PYTORCH_*, TORCHDYNAMO_*, ...), and Python its
# own at start-up (PYTHONPATH, PYTHONHASHSEED, ...): a worker whose environment sets them differently
# from the warm process's must start cold to see them.
IMPORT_TIME_ENV_PREFIXES = ("TORCH_", "PYTORCH_", "TORCHDYNAMO_", "TORCHINDUCTOR_", "PYTHON")


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV_PREFIXES)}


class WarmPool:
    def __init__(self, size: int, enabled: bool = True) -> None:
        self.size = size if enabled else 0
        self.ready: list[subprocess.Popen[bytes]] = []
        self._env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
        # Not at once: the node's first workers, its shadow loader and its neighbours are all starting
        # now, and warming up competes with them for the CPU (heartbeats included).
        self._quiet_until = time.monotonic() + REFILL_DELAY_SECONDS

    def maintain(self) -> None:
        """Drop dead warm workers; start new ones up to the pool size once things are quiet."""
        self.ready = [p for p in self.ready if p.poll() is None]
        if time.monotonic() < self._quiet_until or len(self.ready) >= self.size:
            return
        while len(self.ready) < self.size:
            self.ready.append(
                spawn(
                    [sys.executable, "-m", "stalwart.agents.warm_start"],
                    env=self._env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def launch(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes] | None:
        """A warm worker running `argv`, or None (no warm worker ready, or a command that can't use one)."""
        if not warm_eligible(argv) or import_time_env(env) != import_time_env(self._env):
            return None
        while self.ready:
            proc = self.ready.pop(0)
            if proc.poll() is not None or proc.stdin is None:
                continue
            request = LaunchRequest(argv=argv, env=env, cwd=str(cwd), log=str(log))
            try:
                proc.stdin.write(request.model_dump_json().encode() + b"\n")
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                continue
            self._quiet_until = time.monotonic() + REFILL_DELAY_SECONDS
            return proc
        return None

    def close(self) -> None:
        for proc in self.ready:
            stop_process(proc, grace=1.0)
        self.ready = []
