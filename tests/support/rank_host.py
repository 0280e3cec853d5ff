"""Host multi-rank test worlds: the ranks are forked from the product's fork server, not started cold.

Every rank of a checkpoint scenario used to import torch, DCP and the checkpoint engine itself
(about 2.5 CPU-seconds each, a sixth of the end-to-end suite). This process does what a node agent
does: it keeps a fork server (`stalwart.agents.warm_pool.WarmPool`, which has imported them once)
and has it fork the ranks, which become this process's children (it is a child subreaper). A rank
the pool cannot fork starts cold, as the agent's would. One host serves every world a pytest
worker runs (support.ranks starts it once), so the imports are paid once per worker, not per world.

    python rank_host.py LOG

Reads one request per line on stdin (JSON), either a world (world, port, cwd, script, args, env:
rank R logs to CWD/rank-R.log) or one process of a module (module, env, log: a collective-check
rank, whose environment its caller made, as an agent forks it); answers `pids P0 P1 ...` once they
run, then `exit PID CODE` as each ends (CODE as Popen's returncode: -N for signal N). At the end of
stdin it stops what still runs and exits.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stalwart.agents.warm_pool import READY_WAIT_SECONDS, WarmPool
from stalwart.processes import ChildProcess, PipeLines, spawn, stop_process

POLL_SECONDS = 0.02


def rank_env(base: dict[str, str], rank: int, world: int, port: int) -> dict[str, str]:
    """The test's torchrun-like base environment plus rank `rank`'s share."""
    return {
        **base,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def start_ranks(pool: WarmPool, request: dict) -> list[ChildProcess]:  # type: ignore[type-arg]
    world, cwd, script = int(request["world"]), Path(request["cwd"]), request["script"]
    ranks: list[ChildProcess] = []
    for rank in range(world):
        argv = [sys.executable, script, *request["args"]]
        env, log = rank_env(request["env"], rank, world, int(request["port"])), cwd / f"rank-{rank}.log"
        proc = pool.launch(argv, env, cwd, log)
        if proc is None:
            with open(log, "ab") as out:
                proc = spawn(argv, env=env, cwd=cwd, stdout=out)
        ranks.append(proc)
    return ranks


def start_module(pool: WarmPool, request: dict) -> list[ChildProcess]:  # type: ignore[type-arg]
    module, env, log = request["module"], request["env"], Path(request["log"])
    proc = pool.launch_module(module, [], env, log, ready_wait=READY_WAIT_SECONDS)
    if proc is None:
        with open(log, "ab") as out:
            proc = spawn([sys.executable, "-m", module], env=env, stdout=out)
    return [proc]


def main() -> int:
    pool = WarmPool(size=1, log=Path(sys.argv[1]))
    requests = PipeLines(sys.stdin.fileno())
    running: list[ChildProcess] = []
    try:
        while not requests.closed:  # until the test session closes our stdin (or dies)
            line = requests.read(POLL_SECONDS)
            if line:
                request = json.loads(line)
                ranks = start_module(pool, request) if "module" in request else start_ranks(pool, request)
                running += ranks
                print("pids", *(p.pid for p in ranks), flush=True)
            for proc in [p for p in running if p.poll() is not None]:
                print("exit", proc.pid, proc.returncode, flush=True)
                running.remove(proc)
    finally:
        for proc in running:
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
