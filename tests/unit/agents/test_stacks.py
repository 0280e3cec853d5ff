"""Stack capture from real, stuck Python processes: py-spy where it works, the SDK's faulthandler else."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stalwart.agents.stacks import StackMethod, StackTarget, capture_stack, capture_stacks, find_py_spy
from stalwart.processes import spawn, stop_process, wait_for

FUNCTION = "stalwart_test_stuck_in_distinctive_function"
STUCK = f"""
import time
from stalwart.agents.worker_sdk import install
install()
def {FUNCTION}():
    print("ready", flush=True)  # from inside: once it shows, every stack taken has this frame
    for _ in range(1200):  # bounded: 60 s at most
        time.sleep(0.05)
{FUNCTION}()
"""
NO_SDK = STUCK.replace("install()", "pass")


class Worker:
    def __init__(self, tmp: Path, code: str, name: str) -> None:
        self.log_path = tmp / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.proc = spawn([sys.executable, "-c", code], stdout=self.log, stderr=subprocess.STDOUT)
        assert wait_for(lambda: b"ready" in self.log_path.read_bytes() or self.proc.poll() is not None, 30)
        assert self.proc.poll() is None, self.log_path.read_text()

    def stop(self) -> None:
        stop_process(self.proc, grace=2)
        self.log.close()


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    w = Worker(tmp_path, STUCK, "stuck")
    yield w
    w.stop()


def test_the_default_capture_finds_the_stuck_function(worker: Worker) -> None:
    dump = capture_stack(worker.proc.pid, rank=3, log_path=worker.log_path, timeout=20)
    # Which method worked depends on the sandbox (ptrace); the record says which one did.
    assert dump.method is not StackMethod.NONE, dump.attempts
    assert FUNCTION in dump.text and dump.rank == 3 and dump.pid == worker.proc.pid and not dump.truncated
    if find_py_spy() is None:
        assert dump.method is StackMethod.FAULTHANDLER
    print(f"stack captured with {dump.method.value}; failed attempts: {dump.attempts}")


def test_the_faulthandler_fallback_reads_the_new_part_of_the_log(worker: Worker) -> None:
    dump = capture_stack(worker.proc.pid, rank=0, log_path=worker.log_path, timeout=20, methods=("faulthandler",))
    assert dump.method is StackMethod.FAULTHANDLER, dump.attempts
    assert FUNCTION in dump.text and "(most recent call first)" in dump.text
    assert "ready" not in dump.text  # only what the signal added to the log
    assert worker.proc.poll() is None  # the worker lives on


def test_without_py_spy_it_falls_back(worker: Worker, tmp_path: Path) -> None:
    dump = capture_stack(worker.proc.pid, log_path=worker.log_path, timeout=20, py_spy=str(tmp_path / "no-py-spy"))
    assert dump.method is StackMethod.FAULTHANDLER and FUNCTION in dump.text
    assert [a.split(":")[0] for a in dump.attempts] == ["py-spy"]


def test_a_rank_that_is_not_waiting_gets_its_native_frames_too(worker: Worker) -> None:
    """The stuck function sleeps: its Python frames show no wait, so `--native` is tried as well."""
    if find_py_spy() is None:
        pytest.skip("py-spy is not installed")
    dump = capture_stack(worker.proc.pid, log_path=worker.log_path, timeout=20, methods=("py-spy",))
    assert FUNCTION in dump.text, dump.attempts
    # Whether --native works depends on the sandbox; where it fails, the plain dump stands and says why.
    assert dump.method is StackMethod.PY_SPY_NATIVE or [a.split(":")[0] for a in dump.attempts] == ["py-spy-native"]


PLAIN_IN_ALL_REDUCE = """Thread 4242 (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2501)
    wrapper (torch/distributed/c10d_logger.py:81)
    train_step (pretrain_tiny.py:120)
    main (pretrain_tiny.py:150)
    <module> (pretrain_tiny.py:181)
"""
PLAIN_IN_BACKWARD = """Thread 4242 (active): "MainThread"
    _engine_run_backward (torch/autograd/graph.py:823)
    backward (torch/autograd/__init__.py:347)
    backward (torch/_tensor.py:581)
    main (pretrain_tiny.py:130)
    <module> (pretrain_tiny.py:181)
"""
PLAIN_IN_DATA = """Thread 4242 (active): "MainThread"
    next_batch (shadow_client.py:210)
    main (pretrain_tiny.py:120)
    <module> (pretrain_tiny.py:181)
"""


def test_native_frames_are_wanted_only_where_the_python_frames_show_no_wait() -> None:
    """In a collective, the Python frames say it all; in the backward (DDP's all-reduce runs from
    autograd's hooks) only the native frames show whether the rank computes or waits."""
    from stalwart.agents.stacks import native_tells_more

    assert not native_tells_more(PLAIN_IN_ALL_REDUCE)
    assert native_tells_more(PLAIN_IN_BACKWARD)
    assert native_tells_more(PLAIN_IN_DATA)


def test_dumps_are_truncated(worker: Worker) -> None:
    dump = capture_stack(worker.proc.pid, log_path=worker.log_path, timeout=20, max_bytes=40, methods=("faulthandler",))
    assert dump.truncated and len(dump.text.encode()) <= 40


def test_a_worker_without_the_sdk_is_not_signalled(tmp_path: Path) -> None:
    w = Worker(tmp_path, NO_SDK, "no-sdk")
    try:
        dump = capture_stack(w.proc.pid, log_path=w.log_path, timeout=5, methods=("faulthandler",))
        assert dump.method is StackMethod.NONE and "handler" in (dump.error or "")
        assert w.proc.poll() is None  # SIGUSR1 would have killed it
    finally:
        w.stop()


def test_a_dead_pid_and_several_workers(worker: Worker, tmp_path: Path) -> None:
    gone = spawn([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    dumps = capture_stacks(
        [StackTarget(pid=worker.proc.pid, rank=0, log_path=worker.log_path), StackTarget(pid=gone.pid, rank=1)],
        timeout=20,
    )
    assert [d.rank for d in dumps] == [0, 1]
    assert FUNCTION in dumps[0].text
    assert dumps[1].method is StackMethod.NONE and "no process" in (dumps[1].error or "")
    assert dumps[0].__class__.loads(dumps[0].dumps()) == dumps[0]


def test_a_dump_over_budget_keeps_its_python_frames() -> None:
    """Native frames go first: a deep native stack cut short must not leave a rank with no Python frame."""
    from stalwart.agents.stacks import _truncate

    header = 'Thread 7 (idle): "MainThread"\n'
    native = "".join(
        f"    0x7fb7cd8a{i:04x} (libc.so.6)\n    c10d::Reducer::wait (libtorch_cpu.so)\n" for i in range(200)
    )
    python = "    backward (torch/autograd/__init__.py:395)\n    main (pretrain_tiny.py:130)\n"
    text, truncated = _truncate(header + native + python, max_bytes=1024)
    assert truncated and len(text.encode()) <= 1024
    assert "main (pretrain_tiny.py:130)" in text and "libc.so.6" not in text and "MainThread" in text
