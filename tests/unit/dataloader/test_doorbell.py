"""The shadow loader's doorbell: a named pipe that wakes an idle loader when a client changes its
segment, and that never blocks or fails the client that rings it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from stalwart.dataloader import remove_stale_segments
from stalwart.dataloader.doorbell import Doorbell, bell_path, ring


def test_a_ring_wakes_the_loader_once_however_often_it_rang(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "seg.bell")
    try:
        assert not bell.wait(0)
        for _ in range(3):
            ring(bell.path)
        assert bell.wait(5)  # returns at once: the bound only stops a broken run
        assert not bell.wait(0)  # the three rings were one wake-up
    finally:
        bell.close()


def test_ringing_with_no_loader_listening_is_a_no_op(tmp_path: Path) -> None:
    ring(tmp_path / "missing.bell")  # no loader made it yet
    Doorbell(tmp_path / "gone.bell").close()
    ring(tmp_path / "gone.bell")  # made, but its loader stopped: nobody reads it


def test_a_full_pipe_drops_the_ring_and_does_not_block(tmp_path: Path) -> None:
    bell = Doorbell(tmp_path / "full.bell")
    fd = os.open(bell.path, os.O_RDWR)
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 4096)  # the smallest pipe: a page
        for _ in range(5_000):  # past it
            ring(bell.path)
        assert bell.wait(5) and not bell.wait(0)
    finally:
        os.close(fd)
        bell.close()


def test_a_file_in_the_bells_place_is_refused(tmp_path: Path) -> None:
    (tmp_path / "seg.bell").write_text("not a pipe")
    with pytest.raises(OSError, match="not a named pipe"):
        Doorbell(tmp_path / "seg.bell")


def test_stale_bells_go_with_their_segments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALWART_SHM_DIR", str(tmp_path))
    orphan = tmp_path / "stalwart-dl.gone.node-0.bell"  # its segment was removed, its loader is dead
    os.mkfifo(orphan)
    assert bell_path(tmp_path / "stalwart-dl.gone.node-0") == orphan
    assert remove_stale_segments() == []  # a bell is not a segment
    assert not orphan.exists()
