"""Run a script as N real ranks on loopback with the torchrun environment, for multi-rank tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from stalwart.net import free_port
from stalwart.processes import spawn, stop_process


def torchrun_env(rank: int, world: int, port: int) -> dict[str, str]:
    """This process's environment plus what torchrun gives rank `rank` of a one-node world on loopback."""
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }


def launch(script: Path, args: list[str], world: int, cwd: Path) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = torchrun_env(rank, world, port)
        log = open(cwd / f"rank-{rank}.log", "ab")
        procs.append(spawn([sys.executable, str(script), *args], env=env, cwd=cwd, stdout=log))
        log.close()
    return procs


def run_ranks(script: Path, args: list[str], world: int, cwd: Path, timeout: float = 180) -> list[dict]:  # type: ignore[type-arg]
    """Run to completion; return each rank's results/rank-R.json. Fails with the logs if a rank fails."""
    results_dir = Path(args[1]) / "results"  # args: SCENARIO ROOT ...
    for old in results_dir.glob("rank-*.json") if results_dir.exists() else []:
        old.unlink()
    procs = launch(script, [*args], world, cwd)
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            stop_process(p, grace=2)
    if any(codes):
        logs = "\n".join((cwd / f"rank-{r}.log").read_text()[-3000:] for r in range(world))
        raise AssertionError(f"ranks exited {codes}:\n{logs}")
    return [json.loads((results_dir / f"rank-{r}.json").read_text()) for r in range(world)]
