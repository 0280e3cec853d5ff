"""A warm worker: a Python process that has already imported torch and waits to become a worker.

Importing torch takes seconds (more on a loaded host), and a restart pays it once per worker. The
agent keeps one of these per local rank, started while the job trains; at a restart it sends the
worker's command, environment and log file over stdin, and this process becomes the worker by
running the script as __main__, with the same pid, signals and exit codes as a cold start.

    python -m stalwart.agents.warm_start     (then one JSON line on stdin: LaunchRequest)
"""

from __future__ import annotations

import datetime
import importlib
import os
import runpy
import socket
import sys
import time
from typing import Any

from pydantic import BaseModel

from stalwart.net import bound_tcp_store

# Modules that read no configuration at import (the worker SDK does, so it is not here).
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn",
    "torch.nn.functional",
    "numpy",
    "torch.optim",
    "torch.nn.parallel",
    "torch.distributed.checkpoint",
    "stalwart.checkpoint.api",
    "stalwart.checkpoint.adapters",
    "stalwart.dataloader",
    # DDP, FSDP and torch.compile import dynamo (and sympy) on first use: a second or more.
    "torch._dynamo",
)


RENDEZVOUS_WAIT_SECONDS = 10.0
RENDEZVOUS_POLL_SECONDS = 0.01
# torch's env:// rendezvous connects every rank as a client when this says True (torchelastic's
# agent store): rank 0's script then uses the store this process serves on MASTER_ADDR alone.
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
STORE_TIMEOUT = datetime.timedelta(seconds=300)
_rendezvous_store: Any = None  # held for the process's life: the script's process groups use it


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
    return (
        exe in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}") or argv[0] == sys.executable
    )


def wait_for_rendezvous(env: dict[str, str]) -> None:
    """Until rank 0's rendezvous store accepts connections (bounded), polling every 10 ms.

    A torch.distributed client that connects before rank 0 listens is refused and backs off for
    about a second: at a restart every rank starts at once, so that second is most of the process
    group's set-up. A warm worker is ready in milliseconds, so it waits here instead. Whatever
    happens, the script's own rendezvous runs next and reports its own errors."""
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    if env.get("RANK", "0") == "0" or not addr or not port.isdigit():
        return
    deadline = time.monotonic() + RENDEZVOUS_WAIT_SECONDS
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, int(port)), timeout=1.0):
                return
        except OSError:
            time.sleep(RENDEZVOUS_POLL_SECONDS)


def serve_rendezvous(env: dict[str, str]) -> None:
    """On rank 0, serve torch's rendezvous store on MASTER_ADDR only, not on every interface as
    torch's own would, and point the script's env:// rendezvous at it. A cold worker (not warm, or
    another program) keeps torch's default (docs/security.md)."""
    global _rendezvous_store
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    if env.get("RANK") != "0" or not addr or not port.isdigit() or AGENT_STORE_ENV in env:
        return
    try:
        world = int(env.get("WORLD_SIZE", "1"))
        _rendezvous_store = bound_tcp_store(addr, int(port), world, STORE_TIMEOUT)
    except (OSError, ValueError, RuntimeError) as exc:
        # The script's own rendezvous runs next and reports its own errors (a port in use, say).
        print(f"stalwart: no rendezvous store on {addr}:{port} alone ({exc}); torch serves its own", file=sys.stderr)
        return
    os.environ[AGENT_STORE_ENV] = "True"


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
    serve_rendezvous(request.env)
    wait_for_rendezvous(request.env)
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
