"""The fork server (stalwart.agents.warm_start, driven by WarmPool): workers forked from one process
that imported torch once, yet each is the agent's own child, in its own process group, with its own
exit code, log, working directory and random state, as a cold-started worker would be; a spare
(forked ahead of time) runs a worker the same way, and the spares are reaped when the pool closes.
All of it holds for a server started by the pool and for one the agent forked from itself (an agent
forked from the local cluster's agent zygote). The agent's own helpers (`python -m` modules: the
shadow loader, check ranks) are forked the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.paths import REPO

DRIVER = REPO / "tests" / "data" / "fork_server" / "drive_pool.py"


def drive(out: Path, *args: str, warm_imports: str = "") -> dict[str, Any]:
    """Run the stand-in agent (drive_pool.py) and return what it saw."""
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "WARM_IMPORTS": warm_imports},
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.mark.parametrize("server", ["started", "prefork"])
def test_forked_workers_are_the_agents_children_with_their_own_exit_codes(tmp_path: Path, server: str) -> None:
    report = drive(tmp_path, *([server] if server == "prefork" else []), "spare", "0", "3", "kill")
    assert report["server_ready"] and report["preforked"] == (server == "prefork")
    assert [w["returncode"] for w in report["workers"]] == [0, 3, -9, 0]
    assert report["workers"][3]["pid"] in report["spares"]  # the last worker was a spare
    assert report["left"] == []  # the unused spare exited with the server and was reaped
    seen = [json.loads((tmp_path / f"w{i}.json").read_text()) for i in range(4)]
    for i, (worker, saw) in enumerate(zip(report["workers"], seen, strict=True)):
        assert saw["pid"] == worker["pid"] and saw["ppid"] == report["agent"]  # adopted by the "agent"
        assert saw["pgid"] == saw["pid"]  # its own process group: stopping it stops what it started
        assert saw["rank"] == str(i) and saw["cwd"] == str(tmp_path) and saw["main"] == "__main__"
        assert saw["torch_preloaded"] and saw["engine_preloaded"]  # the imports were the server's, not the worker's
        assert not saw["grpc_loaded"]  # a training process carries no etcd client (.importlinter)
        assert saw["open_loader_is_the_function"]  # a preloaded submodule does not hide a lazy export
        assert f"rank {i} says hello" in (tmp_path / f"w{i}.log").read_text()
    assert len({saw["random"] for saw in seen}) == 4  # forked, yet not one random state


@pytest.mark.parametrize("server", ["started", "prefork"])
def test_the_jobs_warm_imports_are_imported_by_the_server_before_it_forks(tmp_path: Path, server: str) -> None:
    """A role's warmImports (its frameworks) are in every forked worker's modules already; a module
    that does not exist is left to the worker and the server still serves."""
    args = [server] if server == "prefork" else []
    report = drive(tmp_path, *args, "0", warm_imports="wave,colorsys,no_such_module_here")
    assert [w["returncode"] for w in report["workers"]] == [0]
    assert json.loads((tmp_path / "w0.json").read_text())["job_imports_preloaded"]
    (tmp_path / "plain").mkdir()
    plain = drive(tmp_path / "plain", *args, "0")
    assert plain["workers"][0]["returncode"] == 0
    assert not json.loads((tmp_path / "plain" / "w0.json").read_text())["job_imports_preloaded"]


def test_a_helper_module_is_forked_as_python_m_would_run_it(tmp_path: Path) -> None:
    report = drive(tmp_path, "prefork", "helper", "0")
    assert [w["returncode"] for w in report["workers"]] == [0, 5]
    saw = json.loads((tmp_path / "w1.json").read_text())
    assert saw["pid"] == report["workers"][1]["pid"] and saw["ppid"] == report["agent"]
    assert saw["main"] == "__main__" and saw["argv0"].endswith("report_worker.py")
    assert saw["torch_preloaded"] and not saw["grpc_loaded"]
    assert "rank 1 says hello" in (tmp_path / "w1.log").read_text()
