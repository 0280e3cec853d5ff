"""The agent zygote (stalwart.cli.zygote, driven by AgentZygote): a forked `stalwart` command runs in
its own session, with the request's environment, writing to its log; a bad request gets no process;
when the zygote cannot serve, the caller is told to start the agent cold. Collective-check ranks
forked by it pass, and their requester learns their exit codes although they are not its children.

Each of those holds for a zygote of the cluster's own and for a session of the shared zygote
(STALWART_AGENT_ZYGOTE=PATH) that this session's end-to-end tests use; a cluster that cannot attach
starts its own, and says why."""

from __future__ import annotations

import os
from importlib.metadata import version
from pathlib import Path

import psutil
import pytest

from stalwart.cluster.agent_zygote import ZYGOTE_ENV, AgentZygote, AttachedZygote, ForkRequest, ZygoteChild
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


def needs_the_shared_zygote() -> None:
    setting = os.environ.get(ZYGOTE_ENV, "")
    if os.sep not in setting:
        pytest.skip(f"this session runs without a shared zygote ({ZYGOTE_ENV}={setting!r})")


@pytest.fixture(params=["own", "shared"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which zygote AgentZygote uses: its own, or a session of the shared one (tests/e2e/conftest.py)."""
    if request.param == "own":
        monkeypatch.setenv(ZYGOTE_ENV, "1")
    else:
        needs_the_shared_zygote()
    return str(request.param)


def test_a_forked_command_runs_with_its_log_and_is_reaped(tmp_path: Path, mode: str) -> None:
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


def test_a_bad_request_starts_nothing(tmp_path: Path, mode: str) -> None:
    zygote = AgentZygote(tmp_path / "zygote.log", lambda: dict(os.environ))
    try:
        assert zygote._ensure_started()
        link = zygote._link
        assert link is not None and isinstance(link, AttachedZygote) == (mode == "shared")
        assert link.send(b'{"args": "not a list"}\n')
        assert link.lines.read(60) == "0"
        assert "a bad request" in (tmp_path / "zygote.log").read_text()
    finally:
        zygote.close()
    assert wait_for(lambda: gone(link.pid), 120)  # closed: it exited, and its parent reaped it


def test_a_cluster_that_cannot_attach_starts_its_own_zygote_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    needs_the_shared_zygote()
    # Its import-time environment differs from the shared zygote's: the forks would not see it.
    zygote = AgentZygote(tmp_path / "zygote.log", lambda: {**os.environ, "PYTHONHASHSEED": "7"})
    try:
        assert zygote._ensure_started()
        assert not isinstance(zygote._link, AttachedZygote) and zygote.pid is not None
        assert psutil.Process(zygote.pid).ppid() == os.getpid()  # our own
        said = (tmp_path / "zygote.log").read_text()
        assert "not attached to" in said and "import-time environment differs (PYTHONHASHSEED)" in said, said
    finally:
        zygote.close()
    # Nothing listens there.
    monkeypatch.setenv(ZYGOTE_ENV, str(tmp_path / "no-zygote.sock"))
    zygote = AgentZygote(tmp_path / "second.log", lambda: dict(os.environ))
    try:
        pid = zygote.start_agent(ForkRequest(args=["version"], env=dict(os.environ), log=str(tmp_path / "v.log")))
        assert pid is not None and "cannot reach it" in (tmp_path / "second.log").read_text()
    finally:
        zygote.close()


def test_turned_off_it_starts_no_zygote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ZYGOTE_ENV, "0")
    zygote = AgentZygote(tmp_path / "zygote.log", lambda: dict(os.environ))
    assert zygote.start_agent(ForkRequest(args=["version"], env={}, log=str(tmp_path / "a.log"))) is None
    assert zygote.pid is None


def test_check_ranks_forked_by_it_pass_and_say_how_they_exited(tmp_path: Path, mode: str) -> None:
    zygote = AgentZygote(tmp_path / "zygote.log", lambda: dict(os.environ))
    try:
        # Not started: the caller starts its ranks cold (the zygote is not started from its thread).
        assert zygote.start_entry(WORKER_ENTRY, dict(os.environ), tmp_path / "cold.log") is None
        assert zygote._ensure_started() and zygote.pid is not None
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
        assert psutil.Process(slow.pid).ppid() == zygote.pid  # the zygote's child, not ours
        assert wait_for(result.exists, 120)  # it started and sleeps
        assert stop_process(slow, grace=1.0) == -9
        assert wait_for(lambda: gone(slow.pid), 120)

        # A rank still running when its zygote is closed dies with it.
        env[RESULT_ENV] = str(tmp_path / "lingering.json")
        lingering = zygote.start_entry(WORKER_ENTRY, env, tmp_path / "lingering.log")
        assert lingering is not None and wait_for(Path(env[RESULT_ENV]).exists, 120)
    finally:
        zygote.close()
    assert wait_for(lambda: gone(lingering.pid), 120)
