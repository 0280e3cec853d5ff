"""The alert rules: promtool checks them and runs their unit tests (each alert fires, and stays
quiet where it should); each links a runbook that exists."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from support.paths import REPO

RULES = REPO / "charts" / "stalwart" / "files" / "alerts.yaml"
TESTS = REPO / "tests" / "data" / "alerts" / "alerts_test.yaml"


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: `make install` installs Debian's prometheus package (as root)"
    return path


def alerts() -> list[dict[str, object]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules() -> None:
    out = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout


def test_promtool_unit_tests_pass() -> None:
    out = subprocess.run(
        [promtool(), "test", "rules", TESTS.name], cwd=TESTS.parent, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    cases = [c for t in yaml.safe_load(TESTS.read_text())["tests"] for c in t.get("alert_rule_test", [])]
    for rule in alerts():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']} is never tested firing"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']} is never tested quiet"


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: str(r["alert"]))
def test_every_alert_links_an_existing_runbook_and_uses_training_job(rule: dict[str, object]) -> None:
    annotations = rule["annotations"]
    assert isinstance(annotations, dict)
    url = annotations["runbook_url"]
    assert url.startswith("runbooks/") and (REPO / url).is_file(), url
    assert "job=" not in str(rule["expr"]).replace("training_job", "")
