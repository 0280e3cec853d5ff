"""The agent zygote: one process per local cluster that has imported the agent and torch, and forks
each node's agent and each collective-check rank (stalwart.cluster.agent_zygote starts it and sends
the requests).

    python -m stalwart.cli.zygote
        prints "ready"; then per ForkRequest line on stdin, the new process's pid on stdout (0: none)

The forked agent leads its own session (its "machine", as a cold agent does), writes to its log,
takes the request's environment, and forks its node's fork server from itself before it imports
the etcd client or starts any thread (stalwart.agents.warm_pool.prefork_server): the server's
imports are the zygote's. The zygote starts no thread and holds no connection, so both forks are
safe; it reaps the agents while it runs and exits when its stdin closes (they live on).

A check rank (a request with an `entry`) leads its own session too, but dies with the zygote, and
writes its exit code to the request's exit file before it exits: its requester cannot wait for it.

    python -m stalwart.cli.zygote --listen PATH
        one shared zygote for the local clusters of this machine (STALWART_AGENT_ZYGOTE=PATH): prints
        "ready", then forks a session zygote per connection, until SIGTERM or SIGINT

Each local cluster otherwise pays the imports once (3.5 CPU-seconds, and its first node waits for
them): where one machine runs many short jobs (a test suite, a developer's loop) a shared zygote pays
them once for all. A connection sends a ZygoteSession line; its session zygote, a fork that has the
imports already, takes the session's folder and log and serves the connection as a spawned zygote
serves its pipes, and exits when the connection closes (its owner is gone). A session whose
import-time environment (PYTHON*, TORCH_*, ...) differs from the shared zygote's is refused: its
forks would not see it, so its owner starts its own zygote. The forks' /proc environment is the
shared zygote's: start it with an agent's environment (stalwart.cluster.local.agent_env), without
the control plane's credentials. (This module imports no credentials module: those hold the etcd
client, which the forks must not.)
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import sys
import traceback
from pathlib import Path
from types import FrameType

from stalwart.agents import warm_start
from stalwart.agents.warm_pool import import_time_env, prefork_server
from stalwart.cluster.agent_zygote import ForkRequest, ZygoteSession
from stalwart.processes import PipeLines, die_with_parent

# What the node's fork server imports, and no more: the agent imports the rest (its command, the etcd
# client) after it has forked the server, so that the server and its workers hold no gRPC (training
# processes import none, .importlinter); those imports are a sixth of a fork server's.
PRELOAD = warm_start.PRELOAD
REAP_SECONDS = 1.0
HELLO_WAIT_SECONDS = 10.0


def become(request: ForkRequest, zygote: int) -> int:
    """In the forked child: become the requested process; returns its exit status."""
    os.setsid()
    fd = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    os.environ.clear()
    os.environ.update(request.env)
    warm_start.reseed()
    try:
        if request.entry:
            return _run_entry(request, zygote)
        prefork_server()
        from stalwart.cli.main import main

        sys.argv = ["stalwart", *request.args]
        return main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


def _run_entry(request: ForkRequest, zygote: int) -> int:
    die_with_parent()
    if os.getppid() != zygote:  # the zygote is gone already: so is whoever asked
        return 137
    warm_start.apply_thread_count(request.env)
    module, _, function = request.entry.partition(":")
    sys.argv = [module, *request.args]
    code = getattr(importlib.import_module(module), function)()
    return code if isinstance(code, int) else 0


def _exit(request: ForkRequest, code: int) -> None:
    if request.exit_file:
        try:
            Path(request.exit_file).write_text(str(code))
        except OSError:
            pass  # the requester then sees a process that died without saying how
    os._exit(code)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def serve(lines: PipeLines) -> None:
    """Fork what each request line asks for, until the requester closes its end."""
    zygote = os.getpid()
    _say(f"ready {zygote}")
    while True:
        _reap()
        line = lines.read(REAP_SECONDS)
        if line is None and lines.closed:
            return  # the cluster's owner is gone: the agents live on
        if not line:
            continue
        try:
            request = ForkRequest.model_validate_json(line)
        except ValueError as exc:
            print(f"stalwart agent zygote: a bad request ({exc})", file=sys.stderr, flush=True)
            _say("0")
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            print(f"stalwart agent zygote: no fork ({exc})", file=sys.stderr, flush=True)
            _say("0")
            continue
        if pid == 0:
            code = 1
            try:
                code = become(request, zygote)
            finally:
                _exit(request, code)
        _say(str(pid))


def listen(path: Path) -> None:
    """The shared zygote: a session zygote forked per connection to `path`."""
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    umask = os.umask(0o177)  # the socket is its owner's alone
    try:
        server.bind(str(path))
    finally:
        os.umask(umask)
    server.listen(64)
    server.settimeout(REAP_SECONDS)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    _say("ready")
    try:
        while True:
            _reap()
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                code = 1
                try:
                    server.close()
                    code = _session(conn)
                finally:
                    os._exit(code)
            conn.close()
    except SystemExit:
        pass
    finally:
        server.close()
        path.unlink(missing_ok=True)


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def _session(conn: socket.socket) -> int:
    """In a session zygote: take the connection as a spawned zygote takes its pipes, and serve it."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent()  # with the shared zygote, and so with its check ranks
    conn.setblocking(True)
    os.dup2(conn.fileno(), 0)
    os.dup2(conn.fileno(), 1)
    conn.close()
    lines = PipeLines(0)
    hello = lines.read(HELLO_WAIT_SECONDS)
    try:
        session = ZygoteSession.model_validate_json(hello or "")
    except ValueError as exc:
        _say(f"refused: not a session ({exc.__class__.__name__})")
        return 1
    theirs, ours = import_time_env(session.env), import_time_env(dict(os.environ))
    if theirs != ours:
        differ = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
        _say(f"refused: the import-time environment differs ({', '.join(differ)})")
        return 1
    try:
        os.chdir(session.cwd)
        fd = os.open(session.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        _say(f"refused: {exc}")
        return 1
    os.dup2(fd, 2)
    os.close(fd)
    serve(lines)
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stalwart.cli.zygote", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=Path, metavar="PATH", help="serve every local cluster that connects here")
    args = parser.parse_args(argv)
    warm_start.preload(PRELOAD)
    if args.listen is not None:
        listen(args.listen)
    else:
        serve(PipeLines(sys.stdin.fileno()))


if __name__ == "__main__":
    main()
