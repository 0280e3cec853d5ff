"""Host a multi-rank test world: the ranks are forked from the product's fork server, not started cold.

Every rank of a checkpoint scenario used to import torch, DCP and the checkpoint engine itself
(about 2.5 CPU-seconds each, a sixth of the end-to-end suite). This process does what a node agent
does: it keeps a fork server (`stalwart.agents.warm_pool.WarmPool`, which has imported them once)
and has it fork the ranks, which become this process's children (it is a child subreaper). A rank
the pool cannot fork starts cold, as the agent's would.

    python rank_host.py WORLD PORT CWD SCRIPT [ARGS ...]

Prints `pids P0 P1 ...` once every rank runs, then `exit PID CODE` as each ends (CODE as Popen's
returncode: -N for signal N), and exits once all have. Rank R logs to CWD/rank-R.log.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from stalwart.agents.warm_pool import WarmPool
from stalwart.processes import ChildProcess, spawn, stop_process

POLL_SECONDS = 0.02


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """This process's environment (the torchrun-like base the test gave it) plus rank `rank`'s share."""
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def start_ranks(pool: WarmPool, script: Path, args: list[str], world: int, port: int, cwd: Path) -> list[ChildProcess]:
    ranks: list[ChildProcess] = []
    for rank in range(world):
        argv, env, log = [sys.executable, str(script), *args], rank_env(rank, world, port), cwd / f"rank-{rank}.log"
        proc = pool.launch(argv, env, cwd, log)
        if proc is None:
            with open(log, "ab") as out:
                proc = spawn(argv, env=env, cwd=cwd, stdout=out)
        ranks.append(proc)
    return ranks


def main() -> int:
    world, port, cwd, script, args = (
        int(sys.argv[1]),
        int(sys.argv[2]),
        Path(sys.argv[3]),
        Path(sys.argv[4]),
        sys.argv[5:],
    )
    pool = WarmPool(size=1, log=cwd / "rank-host.log")
    ranks: list[ChildProcess] = []
    try:
        ranks = start_ranks(pool, script, args, world, port, cwd)
        print("pids", *(p.pid for p in ranks), flush=True)
        running = list(ranks)
        while running:  # bounded by the test: it stops the ranks (and so us) at its timeout
            for proc in [p for p in running if p.poll() is not None]:
                print("exit", proc.pid, proc.returncode, flush=True)
                running.remove(proc)
            time.sleep(POLL_SECONDS)
    finally:
        for proc in ranks:
            stop_process(proc, grace=2)
        pool.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (BrokenPipeError, KeyboardInterrupt):
        sys.exit(1)
    except subprocess.SubprocessError as exc:
        print(f"rank host: {exc}", file=sys.stderr)
        sys.exit(1)
