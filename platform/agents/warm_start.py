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

The server also keeps spares: workers forked (and adopted) ahead of time that wait for a request on
a pipe, so that a restart's workers cost no fork at all, only a pipe write. It forks them while the
agent asks for nothing, and they exit when the server does.

    python -m stalwart.agents.warm_start [--spares N]
        prints "ready"; then per LaunchRequest line on stdin, the new worker's pid on stdout; and
        "spare PID" for each spare it forks (N spares are kept; the agent reaps the unused ones)
"""

from __future__ import annotations

import atexit
import datetime
import errno
import gc
import importlib
import os
import random
import runpy
import socket
import struct
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any, NamedTuple

from pydantic import BaseModel

from stalwart.net import bound_tcp_store
from stalwart.processes import PipeLines, die_with_parent

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
    "stalwart.checkpoint.storage.memory",
    # The lazy packages' public names, through the package (`package:name`): importing a submodule
    # directly would bind its name on the package to the module (`stalwart.dataloader.open_loader`
    # would hide the function of that name).
    "stalwart.checkpoint:Checkpointer",
    "stalwart.checkpoint:TrainState",
    "stalwart.checkpoint:open_storage",
    "stalwart.checkpoint:RetentionPolicy",
    "stalwart.checkpoint:save",
    "stalwart.dataloader:open_loader",
    "stalwart.dataloader:DataConfig",
)


RENDEZVOUS_WAIT_SECONDS = 10.0
RENDEZVOUS_POLL_SECONDS = 0.01
# How long rank 0 tries again to listen on a port that is taken: a rank polling a port nobody listens
# on yet can be given that very port as its own and connect to itself (TCP's simultaneous open on
# loopback), which holds the port until the poller sees it and lets go, a moment later.
RENDEZVOUS_BIND_SECONDS = 2.0
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
    exe = argv[0]
    if os.sep in exe:  # a path: warm only if it is this interpreter (another environment's python runs cold)
        return os.path.abspath(exe) == os.path.abspath(sys.executable)
    return exe in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}")


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
            with socket.create_connection((addr, int(port)), timeout=1.0) as conn:
                if not connected_to_itself(conn):
                    return
                let_go(conn)
        except OSError:
            pass
        time.sleep(RENDEZVOUS_POLL_SECONDS)


def connected_to_itself(conn: socket.socket) -> bool:
    """A loopback connect to a port nobody listens on can be given that port as its own source port,
    and then connects to itself: that is not rank 0's store, and it holds the port rank 0 must bind."""
    return bool(conn.getsockname() == conn.getpeername())


def let_go(conn: socket.socket) -> None:
    """Close with a reset rather than a FIN: a socket closed the usual way keeps its port in TIME_WAIT
    for a minute, and rank 0 could not bind it (SO_REUSEADDR helps only when both sockets set it)."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def serve_rendezvous(env: dict[str, str]) -> None:
    """On rank 0, serve torch's rendezvous store on MASTER_ADDR only, not on every interface as
    torch's own would, and point the script's env:// rendezvous at it. A cold worker (not warm, or
    another program) keeps torch's default (docs/security.md)."""
    global _rendezvous_store
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT", "")
    if env.get("RANK") != "0" or not addr or not port.isdigit() or AGENT_STORE_ENV in env:
        return
    try:
        _rendezvous_store = _bind_store(addr, int(port), int(env.get("WORLD_SIZE", "1")))
    except (OSError, ValueError, RuntimeError) as exc:
        # The script's own rendezvous runs next and reports its own errors (a port in use, say).
        print(f"stalwart: no rendezvous store on {addr}:{port} alone ({exc}); torch serves its own", file=sys.stderr)
        return
    os.environ[AGENT_STORE_ENV] = "True"


def _bind_store(addr: str, port: int, world: int) -> Any:
    """The store on addr:port, trying again for a moment while the port is in use (see
    RENDEZVOUS_BIND_SECONDS): a port that stays taken is the script's to report."""
    deadline = time.monotonic() + RENDEZVOUS_BIND_SECONDS
    while True:
        try:
            return bound_tcp_store(addr, port, world, STORE_TIMEOUT)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() + RENDEZVOUS_POLL_SECONDS >= deadline:
                raise
        time.sleep(RENDEZVOUS_POLL_SECONDS)


def apply_thread_count(env: dict[str, str]) -> None:
    """torch read OMP_NUM_THREADS when the server imported it: a forked process sets its own."""
    if "torch" in sys.modules and env.get("OMP_NUM_THREADS", "").isdigit():
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))


def become_worker(request: LaunchRequest) -> None:
    fd = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(request.env)
    os.chdir(request.cwd)
    apply_thread_count(request.env)
    if request.argv[1] == "-m":  # one of the agent's own helpers (WarmPool.launch_module)
        sys.argv = [request.argv[2], *request.argv[3:]]
        sys.path[0] = request.cwd
        runpy.run_module(request.argv[2], run_name="__main__", alter_sys=True)
        return
    script = os.path.abspath(request.argv[1])
    sys.argv = [script, *request.argv[2:]]
    sys.path[0] = os.path.dirname(script)
    serve_rendezvous(request.env)
    wait_for_rendezvous(request.env)
    runpy.run_path(script, run_name="__main__")


ADOPTION_WAIT_SECONDS = 5.0
# Spares are forked once the agent has asked for nothing for this long: a spare forked while a
# generation starts would take CPU from the workers it is meant to speed up.
SPARE_DELAY_SECONDS = 2.0


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


def reseed() -> None:
    """Forked workers share the server's random state: each draws its own, as a new process would."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _double_fork(agent: int, inherited: Sequence[int] = ()) -> int:
    """Fork twice, as os.fork returns: 0 in the grandchild (the worker to be: its own process group,
    stdin and stdout on /dev/null, the descriptors in `inherited` closed, adopted by the agent), its
    pid in the server. The middle process exits at once, so the grandchild is the agent's child."""
    read_end, write_end = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read_end)
            worker = os.fork()
            if worker == 0:
                os.close(write_end)
                for fd in inherited:
                    os.close(fd)
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 1)  # the server's reply pipe; become_worker points 1 and 2 at the log
                os.close(null)
                os.setpgid(0, 0)  # its own process group, as a spawned worker has: stopping it stops its children
                _adopted_by(agent)
                return 0
            os.write(write_end, f"{worker}\n".encode())
        except BaseException:  # the middle process never serves: the server reads no pid
            os._exit(1)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        line = pipe.readline()
    os.waitpid(middle, 0)  # once it has exited, its child is the agent's
    return int(line)


def fork_worker(request: LaunchRequest, agent: int, inherited: Sequence[int] = ()) -> int:
    """Fork the worker (twice: it must be the agent's child, not ours) and return its pid."""
    pid = _double_fork(agent, inherited)
    if pid == 0:
        reseed()
        raise _Become(request)
    return pid


class Spare(NamedTuple):
    """A worker forked ahead of time, waiting for its request on a pipe (the server holds its write end)."""

    pid: int
    requests: int


def fork_spare(agent: int, inherited: Sequence[int] = ()) -> Spare:
    """A worker forked before anyone asks for it: at a restart it only reads its request, so no fork
    (of a process that holds torch: page tables for gigabytes, twice) is on the restart's path. It
    exits when the server goes (its pipe closes)."""
    read_end, write_end = os.pipe()
    pid = _double_fork(agent, [*inherited, write_end])
    if pid == 0:
        request = _await_request(read_end)
        reseed()
        raise _Become(request)
    os.close(read_end)
    return Spare(pid, write_end)


def _await_request(fd: int) -> LaunchRequest:
    """In a spare: block until the server hands over a request; end quietly when the server is gone."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            os._exit(0)
        data += chunk
    os.close(fd)
    try:
        return LaunchRequest.model_validate_json(data)
    except ValueError as exc:
        print(f"stalwart fork server: a spare got a bad request ({exc})", file=sys.stderr, flush=True)
        os._exit(1)


def _hand_over(spares: list[Spare], line: bytes) -> int:
    """Give the request to the oldest live spare; its pid, or 0 when none is left."""
    while spares:
        spare = spares.pop(0)
        try:
            view = memoryview(line + b"\n")
            while view:
                view = view[os.write(spare.requests, view) :]
            return spare.pid
        except OSError:  # it died (killed while it waited): the next one
            continue
        finally:
            os.close(spare.requests)
    return 0


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def serve(agent: int, spares_wanted: int = 0, lines: PipeLines | None = None) -> LaunchRequest | None:
    """Answer LaunchRequests until stdin closes (`lines`: stdin's lines, if already read from): each
    with the pid of the worker that runs it (a spare's, else a new fork's), or 0. Keeps
    `spares_wanted` spares, forked once no request has come for SPARE_DELAY_SECONDS (never while a
    generation starts), each announced as `spare PID`. Returns the request in a worker, None in the
    server when the agent goes away."""
    _say("ready")
    spares: list[Spare] = []
    lines = lines or PipeLines(sys.stdin.fileno())
    try:
        while True:
            line = lines.read(SPARE_DELAY_SECONDS if len(spares) < spares_wanted else None)
            if line is None:
                if lines.closed:
                    return None
                try:
                    spares.append(fork_spare(agent, [s.requests for s in spares]))
                except (OSError, ValueError) as exc:  # out of processes or memory: forks on demand only
                    print(f"stalwart fork server: no spare ({exc})", file=sys.stderr, flush=True)
                    spares_wanted = len(spares)
                    continue
                _say(f"spare {spares[-1].pid}")
                continue
            if not line:
                continue
            try:
                request = LaunchRequest.model_validate_json(line)
                pid = _hand_over(spares, line.encode()) or fork_worker(request, agent, [s.requests for s in spares])
            except (OSError, ValueError) as exc:
                print(f"stalwart fork server: no worker ({exc})", file=sys.stderr, flush=True)
                pid = 0
            _say(str(pid))
    except _Become as become:
        return become.request


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


def preload(entries: Sequence[str] = PRELOAD) -> None:
    """Import what every worker would (a missing one is the worker's own business), then keep it
    out of the garbage collector: never collected in a worker, nor its pages copied by the GC. A
    module named by the job (warmImports) that fails otherwise is said on stderr and left out."""
    for entry in entries:
        module, _, name = entry.partition(":")
        try:
            loaded = importlib.import_module(module)
            if name:
                getattr(loaded, name)  # a lazy export: loads its module, binds the name
        except (ImportError, AttributeError):
            pass
        except Exception as exc:  # a framework's own import-time failure: the worker meets it cold
            print(f"stalwart fork server: importing {module} failed: {exc!r}", file=sys.stderr, flush=True)
    gc.freeze()


def job_imports(text: str) -> list[str]:
    """The roles' warmImports as the agent passes them: comma-separated module names."""
    return [m for m in text.split(",") if m]


def run(agent: int, spares: int, lines: PipeLines | None = None) -> bool:
    """Serve the agent; in a forked worker, become the worker (run its script as __main__). True in
    a worker whose script returned; a script's exception propagates, as it would from a script."""
    global _exit_code
    request = serve(agent=agent, spares_wanted=spares, lines=lines)
    if request is None:
        return False
    sys.stdin = open(os.devnull)  # the worker's stdin for its whole life
    atexit.register(_exit_without_teardown)
    try:
        become_worker(request)
    except BaseException as exc:
        _exit_code = _exit_code_of(exc)
        raise
    return True


def serve_when_sized(agent: int) -> int:
    """A server its agent forked from itself (stalwart.agents.warm_pool.prefork_server): wait for
    `spares N` on stdin, then serve. Returns the exit status; a worker forked from it exits as a
    process running its script would (the script's exit handlers, then its status)."""
    lines = PipeLines(sys.stdin.fileno())  # what follows the first line is serve()'s
    line = lines.read(None)
    if line is None:
        return 0  # the agent forks no workers
    try:
        fields = line.split()
        spares = int(fields[1])
        imports = job_imports(fields[2]) if len(fields) > 2 else []
    except (IndexError, ValueError):
        print(f"stalwart fork server: expected 'spares N [MODULES]', got {line!r}", file=sys.stderr, flush=True)
        return 2
    if imports:
        preload(imports)  # the job's frameworks, beside what the agent zygote imported
    try:
        if not run(agent, spares, lines):
            return 0  # the server, once the agent has gone
    except BaseException as exc:  # a worker's script raised: reported as the interpreter would
        if not isinstance(exc, SystemExit):
            traceback.print_exc()
        elif isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    atexit._run_exitfuncs()  # the script's exit handlers, then _exit_without_teardown's os._exit
    return _exit_code


def main() -> None:
    extra = job_imports(sys.argv[sys.argv.index("--imports") + 1]) if "--imports" in sys.argv else []
    preload((*PRELOAD, *extra))
    spares = int(sys.argv[sys.argv.index("--spares") + 1]) if "--spares" in sys.argv else 0
    run(os.getppid(), spares)


if __name__ == "__main__":
    main()
