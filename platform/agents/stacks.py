"""Capturing a worker's Python stacks on demand, for hang diagnosis.

First `py-spy dump`, which needs nothing from the worker; then, where py-spy is missing or not
permitted (ptrace), the worker SDK's faulthandler: the SDK registers it on SIGUSR1 to write every
thread's stack to stderr, which is the worker's log file, so the dump is the new part of that file.
Every attempt is bounded in time, and the text in size.

py-spy's plain dump takes milliseconds. `--native` symbolizes every native frame: half a
CPU-second per dump of a process with torch's libraries loaded, and more with CUDA's. So it is taken
only where the plain dump's Python frames do not already show the rank waiting in a collective or a
pipeline transfer (stalwart.diagnosis.stack_state): a rank inside the backward (DDP's all-reduce
runs from autograd's hooks), a CUDA synchronization or any C++ call shows its wait only in native
frames. A rank whose Python frames name its collective gets the same verdict either way.

A dump that cannot tell where its rank is (none, cut short, no Python frame) is taken again with
`py-spy dump --native` before the agent gives up on it (`recapture`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pydantic import Field

from stalwart.agents.worker_sdk import STACK_DUMP_SIGNAL
from stalwart.diagnosis.stack_parse import parse_stack
from stalwart.diagnosis.stack_state import classify
from stalwart.processes import spawn, stop_process
from stalwart.store.records import Record

DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_BYTES = 64 * 1024
_POLL = 0.05
_DUMP_START = re.compile(r"^(Thread|Current thread) 0x[0-9a-f]+ \(most recent call first\):", re.MULTILINE)


class StackMethod(str, Enum):
    PY_SPY_NATIVE = "py-spy-native"
    PY_SPY = "py-spy"
    FAULTHANDLER = "faulthandler"
    NONE = "none"  # every method failed: see `attempts`


class StackDump(Record):
    rank: int | None = None
    pid: int
    method: StackMethod
    text: str = ""
    truncated: bool = False
    captured_at: float = Field(default_factory=time.time)
    error: str | None = None  # why no method worked (method NONE)
    attempts: list[str] = []  # each method that failed, and why
    recaptured: str | None = None  # why the first dump was taken again with `py-spy dump --native`


@dataclass(frozen=True)
class StackTarget:
    pid: int
    rank: int | None = None
    log_path: Path | None = None  # the worker's stderr, for the faulthandler fallback


def find_py_spy() -> str | None:
    """py-spy on PATH, or installed beside this interpreter (a virtual environment's bin)."""
    found = shutil.which("py-spy")
    if found:
        return found
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else None


# A native frame of `py-spy dump --native`: "    pthread_cond_wait (libc.so.6)", "    0x7fb7cd8a3f16 (libc.so.6)".
_NATIVE_FRAME = re.compile(r"^\s+(0x[0-9a-fA-F]+ |.*\((lib[^()]*|[^()]*\.so[.\d]*)\)\s*$)")


def _truncate(text: str, max_bytes: int) -> tuple[str, bool]:
    """At most `max_bytes`. Over that, native frames go first: the Python frames (and the thread
    headers) are what diagnosis reads, and a dump cut short inside a deep native stack would leave
    a rank judged from native frames alone; only then is the end cut."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text, False
    python_only = "\n".join(line for line in text.splitlines() if not _NATIVE_FRAME.match(line))
    return python_only.encode()[:max_bytes].decode(errors="ignore"), True


def _py_spy(binary: str, pid: int, native: bool, timeout: float) -> str:
    argv = [binary, "dump", "--pid", str(pid)] + (["--native"] if native else [])
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=max(0.1, timeout))
    except subprocess.TimeoutExpired:
        stop_process(proc, grace=1.0)
        raise TimeoutError(f"py-spy did not finish within {timeout:.1f}s") from None
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"py-spy exited {proc.returncode}: {text.strip()[-300:]}")
    return text


def handles_signal(pid: int, signum: int) -> bool:
    """Whether the process installed a handler for `signum` (SigCgt in /proc/PID/status).

    Sending SIGUSR1 to a process that does not handle it kills it, so the fallback checks first.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    m = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)$", status, re.MULTILINE)
    return bool(m) and bool(int(m.group(1), 16) & (1 << (signum - 1)))  # type: ignore[union-attr]


def _faulthandler(pid: int, log_path: Path | None, timeout: float) -> str:
    if log_path is None:
        raise RuntimeError("no log file to read the faulthandler dump from")
    if not handles_signal(pid, STACK_DUMP_SIGNAL):
        raise RuntimeError(
            f"the worker has no {STACK_DUMP_SIGNAL.name} handler (worker SDK not installed); "
            "not sending it, it would kill the worker"
        )
    start = log_path.stat().st_size if log_path.exists() else 0
    os.kill(pid, STACK_DUMP_SIGNAL)
    deadline = time.monotonic() + timeout
    seen, stable = -1, 0
    text = ""
    while time.monotonic() < deadline:  # bounded by the deadline
        time.sleep(_POLL)
        with open(log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        m = _DUMP_START.search(text)
        if m is None:
            continue
        stable = stable + 1 if len(text) == seen else 0
        seen = len(text)
        if stable >= 3:  # no growth for three polls: the dump is complete
            return text[m.start() :]
    m = _DUMP_START.search(text)
    if m is None:
        raise TimeoutError(f"no faulthandler dump appeared in {log_path} within {timeout:.1f}s")
    return text[m.start() :]


def native_tells_more(text: str) -> bool:
    """Whether `py-spy dump --native` could say more about where the rank is than this plain dump:
    unless its Python frames already show it waiting in communication."""
    return not classify(parse_stack(text)).state.waiting


def capture_stack(
    pid: int,
    *,
    rank: int | None = None,
    log_path: Path | str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = DEFAULT_MAX_BYTES,
    native: bool = True,
    methods: Sequence[str] = ("py-spy", "faulthandler"),
    py_spy: str | None = None,
) -> StackDump:
    """One worker's stacks, by the first method that works within `timeout` seconds overall; with
    `native`, py-spy's native frames too where they tell more (`native_tells_more`)."""
    deadline = time.monotonic() + timeout
    attempts: list[str] = []
    path = Path(log_path) if log_path is not None else None
    if not Path(f"/proc/{pid}").exists():
        return StackDump(rank=rank, pid=pid, method=StackMethod.NONE, error=f"no process {pid}")
    plan = [
        m for m, name in ((StackMethod.PY_SPY, "py-spy"), (StackMethod.FAULTHANDLER, "faulthandler")) if name in methods
    ]
    binary = py_spy or find_py_spy()
    for method in plan:
        left = deadline - time.monotonic()
        if left <= 0:
            attempts.append(f"{method.value}: no time left")
            continue
        try:
            if method is StackMethod.FAULTHANDLER:
                text = _faulthandler(pid, path, left)
            else:
                if binary is None or not Path(binary).exists():
                    raise FileNotFoundError("py-spy is not installed")
                text = _py_spy(binary, pid, False, left)
                if native and native_tells_more(text):
                    method, text = _with_native(binary, pid, text, deadline, attempts)
        except (OSError, RuntimeError, TimeoutError) as exc:
            attempts.append(f"{method.value}: {exc}")
            continue
        body, truncated = _truncate(text, max_bytes)
        return StackDump(rank=rank, pid=pid, method=method, text=body, truncated=truncated, attempts=attempts)
    return StackDump(
        rank=rank, pid=pid, method=StackMethod.NONE, error="; ".join(attempts) or "no method", attempts=attempts
    )


def _with_native(binary: str, pid: int, plain: str, deadline: float, attempts: list[str]) -> tuple[StackMethod, str]:
    """The native dump, or the plain one already in hand where it fails or no time is left."""
    left = deadline - time.monotonic()
    if left <= 0:
        attempts.append(f"{StackMethod.PY_SPY_NATIVE.value}: no time left")
        return StackMethod.PY_SPY, plain
    try:
        return StackMethod.PY_SPY_NATIVE, _py_spy(binary, pid, True, left)
    except (OSError, RuntimeError, TimeoutError) as exc:
        attempts.append(f"{StackMethod.PY_SPY_NATIVE.value}: {exc}")
        return StackMethod.PY_SPY, plain


RECAPTURE_BYTES = 4  # a recaptured dump may be this many times max_bytes: it was cut short once


def unusable(dump: StackDump) -> str | None:
    """Why a dump cannot tell where its rank is (None: it can): no stack at all, one cut short, or
    one with no Python frame on the thread that matters (a faulthandler dump taken on the wrong
    thread). Diagnosis would blame no one or judge the rank from what is left."""
    if dump.method is StackMethod.NONE or not dump.text.strip():
        return "no stack"
    if dump.truncated:
        return "truncated"
    if not parse_stack(dump.text).frames:
        return "no Python frame"
    return None


def recapture(
    dumps: Sequence[StackDump],
    targets: Sequence[StackTarget],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = DEFAULT_MAX_BYTES,
    py_spy: str | None = None,
) -> list[StackDump]:
    """The dumps, with each unusable one (`unusable`) taken again by `py-spy dump --native` before
    giving up: with a larger size bound, in parallel. Where py-spy fails too, the first dump stays,
    its `attempts` saying why."""
    binary = py_spy or find_py_spy()
    redo = [(i, why) for i, d in enumerate(dumps) if (why := unusable(d)) is not None]
    if not redo:
        return list(dumps)
    out = list(dumps)

    def again(i: int, why: str) -> StackDump:
        first, pid = dumps[i], targets[i].pid
        tried = [*first.attempts, f"{first.method.value}: {why}"]
        if binary is None or not Path(binary).exists():
            return first.model_copy(update={"attempts": [*tried, "py-spy-native: py-spy is not installed"]})
        if not Path(f"/proc/{pid}").exists():
            return first.model_copy(update={"attempts": [*tried, f"py-spy-native: no process {pid}"]})
        try:
            text = _py_spy(binary, pid, True, timeout)
        except (OSError, RuntimeError, TimeoutError) as exc:
            return first.model_copy(update={"attempts": [*tried, f"py-spy-native: {exc}"]})
        body, truncated = _truncate(text, RECAPTURE_BYTES * max_bytes)
        return StackDump(
            rank=first.rank,
            pid=pid,
            method=StackMethod.PY_SPY_NATIVE,
            text=body,
            truncated=truncated,
            attempts=tried,
            recaptured=why,
        )

    with ThreadPoolExecutor(max_workers=min(len(redo), 16)) as pool:
        for (i, _), dump in zip(redo, pool.map(lambda job: again(*job), redo), strict=True):
            out[i] = dump
    return out


def capture_stacks(
    targets: Sequence[StackTarget],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = DEFAULT_MAX_BYTES,
    native: bool = True,
    methods: Sequence[str] = ("py-spy", "faulthandler"),
) -> list[StackDump]:
    """Every target's stacks at about the same moment (in parallel), in the targets' order."""
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(len(targets), 16)) as pool:
        futures = [
            pool.submit(
                capture_stack,
                t.pid,
                rank=t.rank,
                log_path=t.log_path,
                timeout=timeout,
                max_bytes=max_bytes,
                native=native,
                methods=methods,
            )
            for t in targets
        ]
        return [f.result() for f in futures]
