"""`stalwart ARGS` in the test's own process: a pytest plugin (the root conftest loads it) with the
`cli` fixture. The same code path as the installed command (main's `run_app`), without a new
interpreter importing torch and the platform again for every call (about 4 CPU-seconds each)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from stalwart.cli.main import app
from stalwart.cli.on_call import run_app
from stalwart.ops.connection import CONFIG_ENV, DIAGNOSIS_ENV, ETCD_ENV


class Result(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


Cli = Callable[..., Result]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Cli:
    """`cli("checkpoint", "ls", PATH)`: the exit code and what it printed.

    No etcd is configured unless the test says so: HOME points at an empty folder."""
    for name in (ETCD_ENV, DIAGNOSIS_ENV, CONFIG_ENV):
        monkeypatch.delenv(name, raising=False)

    def call(*args: str, env: dict[str, str] | None = None, home: Path | None = None) -> Result:
        home = home or tmp_path
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(sys, "argv", ["stalwart", *args])
        capsys.readouterr()
        code = run_app(app, prog_name="stalwart")
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return call
