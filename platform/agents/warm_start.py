"""The fork server: one Python process per node that has already imported torch and forks workers.

Importing torch (and torch._dynamo, which DDP imports) costs seconds of CPU per process: a node that
started each worker cold paid it per worker and per restart. The agent starts this process once; for
each worker it sends the worker's command, environment and log file over stdin, and the server forks
a process that becomes the worker by running the script as __main__ (same exit codes and signals as
a cold start). Every worker of every generation then costs one fork, not one import.

The fork is doubled so that the worker is not the server's child but the agent's: the agent is a
child subreaper (`stalwart.processes.become_subreaper`), so the orphaned grandchild is reparented to
it, and the agent waits for it, signals it and stops its process group like any worker it spawned.
The worker dies with the agent (PR_SET_PDEATHSIG, set once the agent is its parent).

    python -m stalwart.agents.warm_start     (prints "ready"; then per LaunchRequest line on stdin,
                                              the new worker's pid on stdout)
"""

from __future__ import annotations

import atexit
import datetime
import gc
import importlib
import os
import random
import runpy
import socket
import sys
import time
from typing import Any

from pydantic import BaseModel

from stalwart.net import bound_tcp_store
from stalwart.processes import die_with_parent

# Modules that read no configuration at import (the worker SDK does, so it is not here; what it
# imports is). Whatever a worker imports that is not here, every worker of every generation imports
# again after the fork, all at once at a restart: the platform's own modules (the progress reports'
# records, which hold the job spec's models, the checkpoint engine and its tiers, the data loader's
# client) cost a fifth of a second of CPU per worker, a quarter of a hot-swap on 2 cores.
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn",
    "torch.nn.functional",
    "numpy",
    "torch.optim",
    "torch.nn.parallel",
    "torch.distributed.checkpoint",
    # DDP, FSDP and torch.compile import dynamo (and sympy) on first use: a second or more.
    "torch._dynamo",
    "stalwart.worker_contract",
    "stalwart.agents.fault_hooks",
    "stalwart.store.records",
    "stalwart.checkpoint.api",
    "stalwart.checkpoint.adapters",
    "stalwart.checkpoint.engine",
    "stalwart.checkpoint.storage",
    "stalwart.checkpoint.storage.memory",
    "stalwart.dataloader",
    "stalwart.dataloader.open_loader",
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


ADOPTION_WAIT_SECONDS = 5.0


class _Become(Exception):
    """Raised in the forked worker to leave the server's loop with its request (the stack unwinds,
    so the worker runs the script from main(), not from inside the loop)."""

    def __init__(self, request: LaunchRequest) -> None:
        super().__init__(request.argv)
        self.request = request


def _adopted_by(agent: int) -> None:
    """In the new worker: wait until the agent is our parent, then die with it."""
    deadline = time.monotonic() + ADOPTION_WAIT_SECONDS
    while os.getppid() != agent and time.monotonic() < deadline:
        time.sleep(0.001)
    die_with_parent()
    if os.getppid() != agent:  # the agent is gone (or never adopted us): no worker without it
        os._exit(137)


def _reseed() -> None:
    """Forked workers share the server's random state: each draws its own, as a new process would."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def fork_worker(request: LaunchRequest, agent: int) -> int:
    """Fork the worker (twice: it must be the agent's child, not ours) and return its pid."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            worker = os.fork()
            if worker == 0:
                os.close(write_end)
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 1)  # the server's reply pipe; become_worker points 1 and 2 at the log
                os.close(null)
                os.setpgid(0, 0)  # its own process group, as a spawned worker has: stopping it stops its children
                _adopted_by(agent)
                _reseed()
                raise _Become(request)
            os.write(write_end, f"{worker}\n".encode())
        except _Become:
            raise
        except BaseException:  # the middle process never serves: the server reads no pid
            os._exit(1)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        line = pipe.readline()
    os.waitpid(middle, 0)  # once it has exited, its child is the agent's
    return int(line)


def serve(agent: int) -> LaunchRequest | None:
    """Answer LaunchRequests until stdin closes. Returns the request in a forked worker, None in the
    server when the agent goes away."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            pid = fork_worker(LaunchRequest.model_validate_json(line), agent)
        except _Become as become:
            return become.request
        except (OSError, ValueError) as exc:
            print(f"stalwart fork server: no worker ({exc})", file=sys.stderr, flush=True)
            pid = 0
        sys.stdout.write(f"{pid}\n")
        sys.stdout.flush()
    return None


_exit_code = 0


def _exit_without_teardown() -> None:
    """The worker's last exit handler (registered before the script's, so run after them): exit now.
    Tearing down an interpreter that holds torch touches every object the server created, so a forked
    worker copies the server's whole heap (seconds of CPU) only to throw it away."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(_exit_code)


def _exit_code_of(exc: BaseException) -> int:
    """The status Python would exit with for `exc` (it has printed the message or traceback by then)."""
    if isinstance(exc, SystemExit):
        if exc.code is None:
            return 0
        return exc.code if isinstance(exc.code, int) else 1
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def main() -> None:
    global _exit_code
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    gc.freeze()  # what the server holds is never collected in a worker (nor its pages copied by the GC)
    request = serve(agent=os.getppid())
    if request is not None:
        sys.stdin = open(os.devnull)  # the worker's stdin for its whole life
        atexit.register(_exit_without_teardown)
        try:
            become_worker(request)
        except BaseException as exc:
            _exit_code = _exit_code_of(exc)
            raise


if __name__ == "__main__":
    main()
