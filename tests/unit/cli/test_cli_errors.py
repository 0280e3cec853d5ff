"""The on-call CLI's edges: where it finds etcd, one-line errors with exit codes, help, completion.

Errors run the real entry point in a subprocess: what is checked is what a person sees, and that no
traceback ever reaches them.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from support.cli_commands import leaf_commands
from support.cli_invoke import Result
from typer.testing import CliRunner

from stalwart.cli import errors
from stalwart.cli.main import app
from stalwart.net import free_port
from stalwart.ops.connection import CONFIG_ENV, DIAGNOSIS_ENV, ETCD_ENV, resolve
from stalwart.ops.errors import OpsError
from stalwart.store.etcd_server import EtcdServer

runner = CliRunner()
ON_CALL = {
    ("jobs",),
    ("status",),
    ("incidents",),
    ("incident",),
    ("diagnose",),
    ("check",),
    ("logs",),
    ("node", "list"),
    ("node", "cordon"),
    ("node", "uncordon"),
    ("node", "evict"),
    ("runbook", "list"),
    ("runbook", "show"),
}


def cli_process(*args: str, env: dict[str, str] | None = None) -> Result:
    """The installed entry point in a subprocess (for what needs a fresh process: completion, imports)."""
    base = {k: v for k, v in os.environ.items() if k not in (ETCD_ENV, DIAGNOSIS_ENV, CONFIG_ENV)}
    proc = subprocess.run(
        [sys.executable, "-m", "stalwart.cli.main", *args],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(proc: Result, code: int, *words: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], lines[0]


# -- where etcd is ------------------------------------------------------------------------------


def test_the_flag_beats_the_environment_which_beats_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("etcd: config-host:2379\ndiagnosis_url: http://diag.example:8080/\n")
    monkeypatch.setenv(CONFIG_ENV, str(config))
    monkeypatch.delenv(ETCD_ENV, raising=False)
    monkeypatch.delenv(DIAGNOSIS_ENV, raising=False)
    conn = resolve()
    assert (conn.etcd, conn.diagnosis_url) == ("config-host:2379", "http://diag.example:8080")
    assert conn.etcd_source == str(config)
    monkeypatch.setenv(ETCD_ENV, "http://env-host:2379/")
    assert resolve().etcd == "env-host:2379" and resolve().etcd_source == ETCD_ENV
    assert resolve("flag-host:1234").etcd == "flag-host:1234"
    assert resolve(diagnosis_url="http://flag:9").diagnosis_url == "http://flag:9"


def test_a_config_file_with_a_typo_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("etdc: host:2379\n")
    monkeypatch.setenv(CONFIG_ENV, str(config))
    monkeypatch.delenv(ETCD_ENV, raising=False)
    with pytest.raises(OpsError, match="bad config file"):
        resolve()


def test_the_config_file_is_found_under_xdg_config_home(tmp_path: Path, cli) -> None:
    """No flag, no env: ~/.config/stalwart/config.yaml names an etcd (here one that is not there)."""
    port = free_port("127.0.0.1")
    (tmp_path / ".config" / "stalwart").mkdir(parents=True)
    (tmp_path / ".config" / "stalwart" / "config.yaml").write_text(f"etcd: 127.0.0.1:{port}\n")
    assert_one_line_error(cli("jobs"), 3, f"127.0.0.1:{port}")


# -- one-line errors ----------------------------------------------------------------------------


def test_unreachable_etcd_is_one_line_and_exit_3(tmp_path: Path, cli) -> None:
    port = free_port("127.0.0.1")
    assert_one_line_error(cli_process("jobs", "--etcd", f"127.0.0.1:{port}"), 3, "cannot reach etcd")
    assert_one_line_error(cli("status", "pretrain-tiny", env={ETCD_ENV: f"127.0.0.1:{port}"}), 3)


def test_no_etcd_anywhere_says_how_to_give_one(tmp_path: Path, cli) -> None:
    assert_one_line_error(cli("incidents"), 2, "--etcd", ETCD_ENV)


def test_a_malformed_endpoint_is_a_usage_error(tmp_path: Path, cli) -> None:
    assert_one_line_error(cli("jobs", "--etcd", "not-an-endpoint"), 2, "HOST:PORT")


def test_bad_flags_and_missing_arguments_are_one_line(tmp_path: Path, cli) -> None:
    assert_one_line_error(cli("jobs", "--bogus"), 2, "--bogus", "stalwart jobs --help")
    assert_one_line_error(cli("status"), 2, "stalwart status --help")
    assert_one_line_error(cli("jobs", "--output", "yaml"), 2, "yaml")
    assert_one_line_error(cli("diagnose", "job", "--tp", "zero"), 2, "--tp")


def test_an_unknown_job_is_one_line_naming_the_jobs_there(etcd: EtcdServer, tmp_path: Path, cli) -> None:
    from stalwart.store import Store, keys
    from stalwart.store.records import JobState

    with_state = Store(etcd.endpoint)
    try:
        with_state.put(keys.job_state("cli-known"), JobState(job="cli-known", created_at=1.0, updated_at=1.0))
    finally:
        with_state.close()
    proc = cli("status", "no-such-job", "--etcd", etcd.endpoint)
    assert_one_line_error(proc, 1, "no job 'no-such-job'", "cli-known")
    assert_one_line_error(cli("logs", "Bad/Name", "--etcd", etcd.endpoint), 1, "not a valid job name")
    assert_one_line_error(cli("incident", "inc-9999-zzzzzz", "--etcd", etcd.endpoint), 1, "no incident")


def test_a_long_error_stays_one_line_in_a_narrow_terminal(tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command group prints its errors unwrapped: CI caught a path split mid-word at 80 columns.

    In this process, on a 40-column error console (what COLUMNS=40 gives a fresh process's rich
    console): two CLI processes cost seconds of CPU, and the wrapping is the console's, not the process's."""
    monkeypatch.setattr(errors, "err", Console(stderr=True, width=40))
    deep = tmp_path / ("a-long-folder-name-" * 6) / "ckpt"
    assert_one_line_error(cli("checkpoint", "export-dcp", str(deep), "100", str(tmp_path / "out")), 1, str(deep))
    assert_one_line_error(cli("data", "verify", str(deep)), 1)


def test_the_parallel_layout_must_multiply_to_the_world_size() -> None:
    from stalwart.ops.stacks import topology_sizes

    assert topology_sizes(8, 2, 2, None) == (2, 2, 2)
    assert topology_sizes(4, 1, 1, None) == (1, 1, 4)
    for bad in ((4, 3, 1, None), (8, 2, 1, 2)):
        with pytest.raises(OpsError) as exc:
            topology_sizes(*bad)
        assert exc.value.code == 2 and "world size" in str(exc.value)


# -- help and completion ------------------------------------------------------------------------


def test_every_on_call_command_is_there_with_examples_in_its_help() -> None:
    commands = leaf_commands()
    assert set(commands) >= ON_CALL, ON_CALL - set(commands)
    for path in sorted(ON_CALL):
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "Example" in result.output and f"stalwart {' '.join(path)}" in result.output, path


def test_every_listing_takes_output_json() -> None:
    commands = leaf_commands()
    for path in sorted(ON_CALL):
        options = {o for p in commands[path].params if p.param_type_name == "option" for o in p.opts}
        assert "--output" in options, path


def test_show_completion_prints_a_shell_script() -> None:
    """From a bash (the shell is detected from the parent process), and through the completion variable."""
    cli = f"{shlex.quote(sys.executable)} -m stalwart.cli.main --show-completion"
    proc = subprocess.run(["bash", "--norc", "-c", cli], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "_STALWART_COMPLETE=complete_bash" in proc.stdout and "complete " in proc.stdout
    zsh = cli_process(env={"_STALWART_COMPLETE": "source_zsh"})
    assert zsh.returncode == 0 and "compdef" in zsh.stdout, zsh


def test_the_completion_variable_completes_commands_and_runbook_classes() -> None:
    def complete(words: str) -> list[str]:
        env = {"_STALWART_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(len(words.split()) - 1)}
        proc = cli_process(env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert "runbook" in complete("stalwart runb")
    assert {"nccl_error", "nccl_timeout"} <= set(complete("stalwart runbook show nccl"))
