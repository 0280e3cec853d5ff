"""A thread's CPU wait (the scheduler's run delay) and the step phases' share of it in StepTimer."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from stalwart.agents import worker_sdk
from stalwart.agents.cpu_wait import cpu_wait

linux = pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="Linux's scheduler statistics")


@linux
def test_a_thread_that_shares_its_cpu_with_a_busy_process_waits_for_it() -> None:
    """One CPU for this thread and a busy process: CPU-bound work that needs tens of scheduler
    slices waits between them; a thread's wait is its own, not its process's."""
    cpu = min(os.sched_getaffinity(0))
    busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    seen: list[float | None] = []
    try:

        def work() -> None:
            os.sched_setaffinity(0, {cpu})  # this thread only
            before = cpu_wait()
            sum(i * i for i in range(3_000_000))
            after = cpu_wait()
            assert before is not None and after is not None
            seen.extend([before, after])

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    finally:
        busy.kill()
        busy.wait()
    before, after = seen
    assert before is not None and after is not None and after > before


def test_the_step_timer_reports_the_cpu_wait_of_the_ranks_own_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits in data, optimizer and the rest of the step are reported; those in compute and comm
    (where a rank waits for its peers anyway) are not."""
    clock = iter([0.0, 0.0, 0.01, 0.03, 0.23, 0.23, 0.26, 0.26, 0.31, 0.35, 0.35])
    monkeypatch.setattr(worker_sdk, "_thread_cpu_wait", lambda: next(clock))
    reported: list[dict[str, Any]] = []
    monkeypatch.setattr(worker_sdk, "report_step", lambda step, **kw: reported.append(kw))
    timer = worker_sdk.StepTimer()  # 0.0
    for phase in ("data", "compute", "optimizer", "comm"):  # data 0.01, compute 0.2, optimizer 0.03, comm 0.05
        with timer.phase(phase):
            pass
    timer.report(1)  # 0.35 in all: 0.02 before compute and 0.04 before comm in no phase ('other')
    assert reported[0]["cpu_wait"] == pytest.approx({"data": 0.01, "optimizer": 0.03, "other": 0.06})


def test_without_the_kernels_word_no_cpu_wait_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_sdk, "_thread_cpu_wait", lambda: None)
    reported: list[dict[str, Any]] = []
    monkeypatch.setattr(worker_sdk, "report_step", lambda step, **kw: reported.append(kw))
    timer = worker_sdk.StepTimer()
    with timer.phase("optimizer"):
        pass
    timer.report(1)
    assert reported[0]["cpu_wait"] is None and reported[0]["optimizer_time"] is not None


@linux
def test_each_thread_reads_its_own_file_and_closes_it_when_it_ends() -> None:
    from stalwart.agents import cpu_wait as module

    before = len(os.listdir("/proc/self/fd"))
    named: list[str] = []

    def read() -> None:
        assert cpu_wait() is not None
        named.append(os.readlink(f"/proc/self/fd/{module._opened.file.fd}"))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(named)) == 8 and all(name.endswith("/schedstat") for name in named)
    assert len(os.listdir("/proc/self/fd")) <= before  # (the finished threads' files are closed)


@linux
def test_a_forked_child_reads_its_own_thread_not_its_parent_s() -> None:
    """The file a thread opened names that thread: after a fork the child opens its own."""
    script = """
import os
from stalwart.agents import cpu_wait as module
assert module.cpu_wait() is not None
parent = os.readlink(f"/proc/self/fd/{module._opened.file.fd}")
pid = os.fork()
if pid == 0:
    ok = module.cpu_wait() is not None
    child = os.readlink(f"/proc/self/fd/{module._opened.file.fd}")
    os._exit(0 if ok and child == f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat" and child != parent else 1)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""
    assert subprocess.run([sys.executable, "-c", script], timeout=120).returncode == 0
