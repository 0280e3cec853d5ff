"""The checkpoint writer thread yields to training, and its knob is checked."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil
import pytest

from stalwart.checkpoint.priority import NICE_ENV, lower_this_thread, writer_nice


def _in_a_thread(nice: int | None) -> tuple[dict[str, bool], int, object]:
    out: list[tuple[dict[str, bool], int, object]] = []

    def run() -> None:
        done = lower_this_thread(nice)
        tid = threading.get_native_id()
        out.append((done, os.getpriority(os.PRIO_PROCESS, tid), psutil.Process(tid).ionice()))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


def test_the_writer_thread_gets_lower_cpu_and_best_effort_io_priority_and_the_caller_keeps_its_own() -> None:
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    done, nice, io = _in_a_thread(12)
    assert done == {"nice": True, "ionice": True}
    assert nice == max(12, before)
    assert io.ioclass == psutil.IOPRIO_CLASS_BE and io.value == 7  # type: ignore[attr-defined]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


def test_nice_zero_leaves_the_writer_at_trainings_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NICE_ENV, "0")
    done, _, _ = _in_a_thread(None)
    assert done == {"nice": False, "ionice": False}


@pytest.mark.parametrize("raw", ["-1", "20", "low"])
def test_a_bad_nice_value_is_named(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(NICE_ENV, raw)
    with pytest.raises(ValueError, match=NICE_ENV):
        writer_nice()


def test_a_bad_nice_value_fails_the_checkpointer_not_its_writer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from stalwart.checkpoint.engine import Checkpointer
    from stalwart.checkpoint.storage.filesystem import FileStorage

    monkeypatch.setenv(NICE_ENV, "99")
    with pytest.raises(ValueError, match=NICE_ENV):
        Checkpointer(FileStorage(tmp_path))
