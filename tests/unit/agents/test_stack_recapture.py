"""A dump that cannot tell where its rank is (none, cut short, no Python frame) is taken again with
`py-spy dump --native` before the agent gives up on it.

One test recaptures a real process with the real py-spy (where a sandbox forbids ptrace, the
recapture fails and the dump says why). The truncated case stands a recorded `py-spy dump --native`
output (from the diagnosis corpus, taken by the real py-spy on a real hung rank) in for the binary,
so that the rank's frames are known."""

from __future__ import annotations

import gzip
import json
import stat
import sys
from pathlib import Path

import pytest
from support.paths import REPO

from stalwart.agents.stacks import (
    StackDump,
    StackMethod,
    StackTarget,
    capture_stacks,
    find_py_spy,
    recapture,
    unusable,
)
from stalwart.processes import spawn, stop_process

CORPUS_TEXTS = REPO / "tests" / "data" / "diagnosis" / "corpus" / "stacks.json.gz"
RECORDED = "031999969b8d"  # a rank hung in the data-parallel all-reduce, with native frames


def _recorded_py_spy(tmp_path: Path) -> Path:
    """An executable that prints the recorded dump for the pid it is asked about, as py-spy does."""
    text = json.loads(gzip.decompress(CORPUS_TEXTS.read_bytes()))[RECORDED]
    script = tmp_path / "py-spy"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"text = {text!r}\n"
        "assert sys.argv[1:3] == ['dump', '--pid'] and sys.argv[4:] == ['--native'], sys.argv\n"
        "print(text.replace('<<pid>>', sys.argv[3]))\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.fixture
def sleeper() -> object:
    proc = spawn([sys.executable, "-c", "import time\nfor _ in range(600): time.sleep(0.1)"])
    yield proc
    stop_process(proc, grace=2)


def test_what_makes_a_dump_unusable() -> None:
    good = 'Thread 1 (idle): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:2501)\n'
    assert unusable(StackDump(pid=1, method=StackMethod.PY_SPY, text=good)) is None
    assert unusable(StackDump(pid=1, method=StackMethod.NONE, error="x")) == "no stack"
    assert unusable(StackDump(pid=1, method=StackMethod.FAULTHANDLER, text=good, truncated=True)) == "truncated"
    native_only = 'Thread 1 (idle): "MainThread"\n    pthread_cond_wait (libc.so.6)\n'
    assert unusable(StackDump(pid=1, method=StackMethod.PY_SPY, text=native_only)) == "no Python frame"


def test_a_truncated_dump_is_taken_again_with_native_frames(tmp_path: Path, sleeper: object) -> None:
    pid = sleeper.pid  # type: ignore[attr-defined]
    cut = StackDump(rank=5, pid=pid, method=StackMethod.FAULTHANDLER, text="Thread 0x1 (most recent", truncated=True)
    fine = StackDump(rank=6, pid=pid, method=StackMethod.PY_SPY, text='Thread 1 (idle): "MainThread"\n    f (a.py:1)\n')
    targets = [StackTarget(pid, 5), StackTarget(pid, 6)]
    again, kept = recapture([cut, fine], targets, py_spy=str(_recorded_py_spy(tmp_path)))
    assert kept == fine
    assert again.method is StackMethod.PY_SPY_NATIVE and again.recaptured == "truncated" and again.rank == 5
    assert f"Thread {pid} (idle)" in again.text and "all_reduce_data_parallel_grads" in again.text
    assert again.attempts == ["faulthandler: truncated"]


def test_where_py_spy_cannot_read_the_process_the_first_dump_stays_and_says_why(sleeper: object) -> None:
    """The real py-spy: it recaptures where the sandbox lets it, and says why not where not."""
    binary = find_py_spy()
    if binary is None:
        pytest.skip("py-spy is not installed")
    pid = sleeper.pid  # type: ignore[attr-defined]
    [first] = capture_stacks([StackTarget(pid, 0)], methods=("py-spy",), timeout=20)
    missing = StackDump(rank=0, pid=pid, method=StackMethod.NONE, error="x", attempts=first.attempts)
    [after] = recapture([missing], [StackTarget(pid, 0)], py_spy=binary, timeout=20)
    if after.method is StackMethod.PY_SPY_NATIVE:
        assert after.recaptured == "no stack" and "sleep" in after.text
    else:
        assert after.method is StackMethod.NONE and after.attempts[-1].startswith("py-spy-native: ")
    print(f"recapture with the real py-spy: {after.method.value}; attempts: {after.attempts}")
