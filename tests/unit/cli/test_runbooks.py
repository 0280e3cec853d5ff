"""Runbooks: one per failure class, each complete, each command it cites real, each reachable by any spelling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli_commands import check_command, stalwart_commands
from support.paths import REPO
from typer.testing import CliRunner

from stalwart.cli.main import app
from stalwart.runbooks import (
    EVENT_RUNBOOKS,
    EXTRA_RUNBOOKS,
    RUNBOOKS_ENV,
    list_runbooks,
    load_runbook,
    runbook_for_incident,
    runbook_id,
    runbooks_dir,
)
from stalwart.signatures import default_database
from stalwart.spec.model import FailureEvent
from stalwart.store.records import Incident

RUNBOOKS = REPO / "runbooks"
SECTIONS = ("Symptoms", "What Stalwart already did automatically", "How to confirm", "What to do", "When to escalate")
runner = CliRunner()


def all_runbook_files() -> list[Path]:
    return sorted(RUNBOOKS.glob("*.md"))


def test_every_signature_class_has_a_runbook() -> None:
    classes = [c.name for c in default_database().classes]
    assert classes, "the signature database is empty"
    missing = [c for c in classes if not (RUNBOOKS / f"{c}.md").is_file()]
    assert not missing, f"signature classes without a runbook: {missing}"


def test_every_incident_class_links_to_an_existing_runbook() -> None:
    assert set(EVENT_RUNBOOKS) == set(FailureEvent), "a FailureEvent has no runbook mapping"
    for event, rid in EVENT_RUNBOOKS.items():
        assert (RUNBOOKS / f"{rid}.md").is_file(), f"{event.value} -> {rid}.md is missing"
    for rid in EXTRA_RUNBOOKS:
        assert (RUNBOOKS / f"{rid}.md").is_file()


@pytest.mark.parametrize("path", all_runbook_files(), ids=lambda p: p.stem)
def test_runbook_has_every_section_in_order(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("# "), "a runbook starts with its title"
    headings = [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]
    assert headings == list(SECTIONS), headings
    confirm = text.split("## How to confirm", 1)[1].split("## What to do", 1)[0]
    assert stalwart_commands(confirm), "'How to confirm' must give stalwart commands in a code block"


@pytest.mark.parametrize("path", all_runbook_files(), ids=lambda p: p.stem)
def test_every_command_a_runbook_cites_exists(path: Path) -> None:
    commands = stalwart_commands(path.read_text())
    assert commands
    problems = [f"stalwart {' '.join(c)}: {why}" for c in commands if (why := check_command(c))]
    assert not problems, problems


def test_the_command_checker_catches_what_it_should() -> None:
    """The checker itself: a misspelt command, an unknown option or an extra argument is caught."""
    assert check_command(["diagnose", "JOB"]) is None
    assert check_command(["node", "evict", "NODE", "--job", "JOB", "--yes"]) is None
    assert check_command(["diagnoze", "JOB"]) is not None
    assert check_command(["status", "JOB", "--verbose"]) is not None
    assert check_command(["status", "JOB", "EXTRA"]) is not None
    assert check_command(["node", "drain", "NODE"]) is not None


def test_links_between_runbooks_point_at_files() -> None:
    import re

    for path in all_runbook_files():
        for target in re.findall(r"\]\(([a-z_]+\.md)\)", path.read_text()):
            assert (RUNBOOKS / target).is_file(), f"{path.name} links to missing {target}"


@pytest.mark.parametrize(
    ("spelling", "rid"),
    [
        ("nccl-timeout", "nccl_timeout"),
        ("NCCL_TIMEOUT", "nccl_timeout"),
        ("NaNLoss", "nan_loss"),
        ("Hang", "hang"),
        ("LostNode", "lost_node"),
        ("MACHINE_FAULT", "machine_fault"),
        ("xid79", "xid"),
        ("Xid-79", "xid"),
        ("user code error", "user_code_error"),
        ("ecc", "ecc_error"),
    ],
)
def test_any_spelling_finds_the_runbook(spelling: str, rid: str) -> None:
    assert runbook_id(spelling) == rid
    assert load_runbook(spelling).id == rid


def test_an_incident_links_to_its_own_runbook_then_the_verdicts_then_its_class() -> None:
    base = Incident(
        id="inc-0001-abcdef", job="j", failure_class=FailureEvent.HANG, generation=1, failed_at=1.0, detected_at=2.0
    )
    assert runbook_for_incident(base) == "hang"
    with_verdict = base.model_copy(update={"verdict": {"runbook": "nccl_timeout"}})
    assert runbook_for_incident(with_verdict) == "nccl_timeout"
    explicit = with_verdict.model_copy(update={"runbook": "xid"})
    assert runbook_for_incident(explicit) == "xid"


def test_the_package_finds_the_repository_runbooks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Through stalwart.cli/runbooks (the symlink here, package data in a wheel), or STALWART_RUNBOOKS."""
    monkeypatch.delenv(RUNBOOKS_ENV, raising=False)
    assert Path(str(runbooks_dir())).resolve() == RUNBOOKS.resolve()
    assert {b.id for b in list_runbooks()} == {p.stem for p in all_runbook_files()}
    (tmp_path / "hang.md").write_text("# Our hang\n\nCall the team.\n")
    monkeypatch.setenv(RUNBOOKS_ENV, str(tmp_path))
    assert [b.id for b in list_runbooks()] == ["hang"]
    assert load_runbook("Hang").title == "Our hang"


def test_runbook_list_and_show() -> None:
    listed = runner.invoke(app, ["runbook", "list", "-o", "json"])
    assert listed.exit_code == 0, listed.output
    books = json.loads(listed.stdout)
    assert {b["id"] for b in books} == {p.stem for p in all_runbook_files()}
    assert all(b["title"] and b["path"] == f"runbooks/{b['id']}.md" for b in books)
    shown = runner.invoke(app, ["runbook", "show", "nccl-timeout"])
    assert shown.exit_code == 0, shown.output
    assert "NCCL timeout" in shown.stdout and "When to escalate" in shown.stdout
    raw = runner.invoke(app, ["runbook", "show", "Hang", "--raw"])
    assert raw.stdout == (RUNBOOKS / "hang.md").read_text()


def test_an_unknown_runbook_is_one_line_naming_the_known_ones() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "stalwart.cli.main", "runbook", "show", "gremlins"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "gremlins" in proc.stderr and "nccl_timeout" in proc.stderr


def test_the_controllers_runbook_links_resolve() -> None:
    """The controller names runbooks too (policy.RUNBOOKS, and machine classes for machine faults)."""
    policy = pytest.importorskip("stalwart.controller.core.policy")
    names = list(getattr(policy, "RUNBOOKS", {}).values()) + sorted(getattr(policy, "MACHINE_CLASSES", ()))
    for name in names:
        assert (RUNBOOKS / f"{runbook_id(name)}.md").is_file(), f"the controller links {name!r}: no runbook"


def test_every_command_the_on_call_guide_cites_exists() -> None:
    commands = stalwart_commands((REPO / "docs" / "oncall.md").read_text())
    assert len(commands) >= 15
    problems = [f"stalwart {' '.join(c)}: {why}" for c in commands if (why := check_command(c))]
    assert not problems, problems
