"""A warm worker: a Python process that has already imported torch and waits to become a worker.

Importing torch takes seconds (more on a loaded host), and a restart pays it once per worker. The
agent keeps one of these per local rank, started while the job trains; at a restart it sends the
worker's command, environment and log file over stdin, and this process becomes the worker by
running the script as __main__, with the same pid, signals and exit codes as a cold start.

    python -m stalwart.agents.warm_start     (then one JSON line on stdin: LaunchRequest)
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys

from pydantic import BaseModel

# Modules that read no configuration at import (the worker SDK does, so it is not here).
PRELOAD = ("torch", "torch.distributed", "torch.nn", "torch.nn.functional", "numpy",
           "torch.nn.parallel", "torch.distributed.checkpoint", "stalwart.checkpoint", "stalwart.dataloader")  # fmt: skip


class LaunchRequest(BaseModel):
    argv: list[str]  # [python, script.py, args...]
    env: dict[str, str]
    cwd: str
    log: str


def warm_eligible(argv: list[str]) -> bool:
    """Only `python script.py ...`: a module (-m) or code (-c) or another program starts cold."""
    if len(argv) < 2 or not argv[1].endswith(".py"):
        return False
    exe = os.path.basename(argv[0])
    return exe in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}") or argv[0] == sys.executable


def become_worker(request: LaunchRequest) -> None:
    fd = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    if "torch" in sys.modules and request.env.get("OMP_NUM_THREADS", "").isdigit():
        sys.modules["torch"].set_num_threads(int(request.env["OMP_NUM_THREADS"]))
    script = os.path.abspath(request.argv[1])
    sys.argv = [script, *request.argv[2:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    line = sys.stdin.readline()
    if not line:
        return  # the agent went away or drained the pool before using us
    sys.stdin.close()
    become_worker(LaunchRequest.model_validate_json(line))


if __name__ == "__main__":
    main()
