"""The agent zygote (stalwart.cli.zygote, driven by AgentZygote): a forked `stalwart` command runs in
its own session, with the request's environment, writing to its log; a bad request gets no process;
when the zygote cannot serve, the caller is told to start the agent cold. Collective-check ranks
forked by it pass, and their requester learns their exit codes although they are not its children."""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path

import psutil
import pytest

from stalwart.cluster.agent_zygote import ZYGOTE_ENV, AgentZygote, ForkRequest, ZygoteChild
from stalwart.health.collective_records import RESULT_ENV
from stalwart.health.collective_runner import WORKER_ENTRY, run_collective_check
from stalwart.health.collective_worker import SLOW_START_ENV
from stalwart.processes import stop_process, wait_for


def gone(pid: int) -> bool:
    """Exited and reaped by the zygote (not a zombie left behind)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_DEAD
    except psutil.NoSuchProcess:
        return True


def test_a_forked_command_runs_with_its_log_and_is_reaped(tmp_path: Path) -> None:
    zygote = AgentZygote(tmp_path / "zygote.log", lambda: dict(os.environ))
    try:
        log = tmp_path / "agent.log"
        pid = zygote.start_agent(ForkRequest(args=["version"], env=dict(os.environ), log=str(log)))
        assert pid is not None and pid > 0
        assert wait_for(lambda: version("stalwart") in (log.read_text() if log.exists() else ""), 120)
        assert wait_for(lambda: gone(pid), 120)
        # A second one from the same zygote, with an option the command refuses: its error, in its log.
        bad = tmp_path / "bad.log"
        pid = zygote.start_agent(ForkRequest(args=["agent", "--no-such-option"], env=dict(os.environ), log=str(bad)))
        assert pid is not None
        assert wait_for(lambda: "--no-such-option" in (bad.read_text() if bad.exists() else ""), 120)
        assert wait_for(lambda: gone(pid), 120)
    finally:
        zygote.close()


def test_a_bad_request_starts_nothing(tmp_path: Path) -> None:
    zygote = AgentZygote(tmp_path / "zygote.log", lambda: dict(os.environ))
    try:
        assert zygote._ensure_started()
        proc = zygote._proc
        assert proc is not None and proc.stdin is not None and zygote._lines is not None
        proc.stdin.write(b'{"args": "not a list"}\n')
        proc.stdin.flush()
        assert zygote._lines.read(60) == "0"
        assert "a bad request" in (tmp_path / "zygote.log").read_text()
    finally:
        zygote.close()
    assert proc.poll() is not None


def test_turned_off_it_starts_no_zygote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ZYGOTE_ENV, "0")
    zygote = AgentZygote(tmp_path / "zygote.log", lambda: dict(os.environ))
    assert zygote.start_agent(ForkRequest(args=["version"], env={}, log=str(tmp_path / "a.log"))) is None
    assert zygote._proc is None


def test_check_ranks_forked_by_it_pass_and_say_how_they_exited(tmp_path: Path) -> None:
    zygote = AgentZygote(tmp_path / "zygote.log", lambda: dict(os.environ))
    try:
        # Not started: the caller starts its ranks cold (the zygote is not started from its thread).
        assert zygote.start_entry(WORKER_ENTRY, dict(os.environ), tmp_path / "cold.log") is None
        assert zygote._ensure_started() and zygote._proc is not None
        forked: list[ZygoteChild] = []

        def start(env: dict[str, str], log: Path) -> ZygoteChild:
            child = zygote.start_entry(WORKER_ENTRY, env, log)
            assert child is not None
            forked.append(child)
            return child

        report = run_collective_check(tmp_path / "check", nodes=2, procs_per_node=1, backend="gloo", start=start)
        assert report.passed, report.model_dump_json(indent=1)
        assert report.exit_codes == {0: 0, 1: 0}
        assert len(forked) == 2

        # A rank stopped before it finishes wrote no exit code: it is reported killed.
        result = tmp_path / "slow.json"
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", RESULT_ENV: str(result), SLOW_START_ENV: "60"}
        slow = zygote.start_entry(WORKER_ENTRY, env, tmp_path / "slow.log")
        assert slow is not None and slow.poll() is None
        assert psutil.Process(slow.pid).ppid() == zygote._proc.pid  # the zygote's child, not ours
        assert wait_for(result.exists, 120)  # it started and sleeps
        assert stop_process(slow, grace=1.0) == -9
        assert wait_for(lambda: gone(slow.pid), 120)
    finally:
        zygote.close()
