"""The layout promise: `platform/` is imported as `stalwart`, and `import platform` stays stdlib."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from support.paths import REPO


def test_import_platform_from_repo_root_is_the_standard_library() -> None:
    code = "import platform, sysconfig; print(platform.__file__); print(platform.python_version())"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    path = out.stdout.splitlines()[0]
    assert not path.startswith(str(REPO)), path
    assert out.stdout.splitlines()[1].startswith("3.11")


def test_torch_still_imports_from_repo_root() -> None:
    subprocess.run([sys.executable, "-c", "import torch, torch.distributed"], cwd=REPO, check=True)


def test_stalwart_is_the_platform_folder_without_an_init() -> None:
    import stalwart.controller

    assert not (REPO / "platform" / "__init__.py").exists()
    assert stalwart.controller.__file__.startswith(str(REPO / "platform"))


def test_every_subpackage_is_declared() -> None:
    """A folder missing from pyproject's package list would vanish from a wheel install."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared = set(config["tool"]["setuptools"]["packages"])
    on_disk = {
        "stalwart." + ".".join(p.parent.relative_to(REPO / "platform").parts)
        for p in (REPO / "platform").rglob("__init__.py")
    }
    assert on_disk <= declared, on_disk - declared


def test_console_script_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "stalwart.cli.main", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    assert "run" in out.stdout
