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
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import traceback
from pathlib import Path

from stalwart.agents import warm_start
from stalwart.agents.warm_pool import prefork_server
from stalwart.cluster.agent_zygote import ForkRequest
from stalwart.processes import PipeLines, die_with_parent

# What the node's fork server imports, and no more: the agent imports the rest (its command, the etcd
# client) after it has forked the server, so that the server and its workers hold no gRPC (training
# processes import none, .importlinter); those imports are a sixth of a fork server's.
PRELOAD = warm_start.PRELOAD
REAP_SECONDS = 1.0


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


def serve() -> None:
    zygote = os.getpid()
    _say("ready")
    lines = PipeLines(sys.stdin.fileno())
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


def main() -> None:
    warm_start.preload(PRELOAD)
    serve()


if __name__ == "__main__":
    main()
