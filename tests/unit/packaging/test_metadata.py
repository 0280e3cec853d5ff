"""The package's metadata takes ranges (Python 3.10-3.12, torch>=2.5) while `make install` (and so CI)
keeps this machine's exact torch through the constraints file."""

from __future__ import annotations

import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from support.paths import REPO

pytestmark = pytest.mark.unit

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
CONTROL_PLANE = {
    "fastapi",
    "uvicorn",
    "starlette",
    "grpcio",
    "etcd-sdk-python",
    "jinja2",
    "typer",
    "rich",
    "kubernetes",
    "kopf",
    "torch",
    "boto3",
}


def requirements(entries: list[str]) -> list[Requirement]:
    return [Requirement(entry) for entry in entries]


def test_python_310_to_312_are_allowed() -> None:
    from packaging.specifiers import SpecifierSet

    allowed = SpecifierSet(PROJECT["requires-python"])
    for version in ("3.10.0", "3.11.7", "3.12.1"):
        assert Version(version) in allowed, version
    assert Version("3.9.18") not in allowed


def test_the_base_install_is_the_worker_side() -> None:
    names = {r.name for r in requirements(PROJECT["dependencies"])}
    assert names & CONTROL_PLANE == set(), names


def test_torch_is_a_range_wherever_it_is_declared() -> None:
    extras = PROJECT["optional-dependencies"]
    torches = [r for entries in extras.values() for r in requirements(entries) if r.name == "torch"]
    assert torches, "no extra offers torch"
    for requirement in torches:
        assert "==" not in str(requirement.specifier), requirement
        assert Version("2.5.0") in requirement.specifier and Version("2.4.0") not in requirement.specifier
        assert Version("2.13.0") in requirement.specifier
    assert "stalwart[torch,s3]" in extras["platform"]
    assert "stalwart[all]" in extras["test"]


def test_make_install_pins_this_machines_torch_through_the_constraints_file() -> None:
    constraints = (REPO / "constraints" / "cpu.txt").read_text().split()
    assert "torch==2.13.0" in constraints
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^CONSTRAINTS := constraints/cpu\.txt$", makefile, re.M)
    install = [line for line in makefile.splitlines() if re.match(r"\t\$\(BIN\)/(pip|uv pip) install", line)]
    assert len(install) == 2, install
    pip, uv = install
    assert "-c $(CONSTRAINTS)" in pip and " torch " in pip  # pip takes the local 2.13.0 wheel
    assert "-c $(CONSTRAINTS)" in uv and "'.[test]'" in uv
