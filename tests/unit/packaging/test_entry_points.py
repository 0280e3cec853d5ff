"""The console scripts check that the platform extra is installed before they import the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_the_console_scripts_check_for_the_platform_extra_before_importing_the_cli() -> None:
    """`stalwart` in a worker-only install says which extra to install, in one line; here (everything
    installed) nothing is missing and the CLI runs."""
    code = (
        "import sys; import stalwart.entry_points as e; "
        "print(e.missing_modules(), e.missing_modules(('no_such_module_here',)), 'stalwart.cli.main' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["[]", "['no_such_module_here']", "False"], proc.stderr
