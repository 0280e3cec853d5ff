"""The console scripts (`stalwart`, `kubectl-stalwart`): the CLI behind a check for its extra.

A worker-side install (`pip install stalwart`, docs/install.md) carries the CLI's code but not the
control plane's libraries; run there, the CLI would die in a traceback from deep in an import. This
module imports nothing of the CLI until it has checked, without importing them, that those libraries
are installed, and otherwise says in one line which extra to install.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec

# Import names of the `platform` extra's libraries that the CLI's commands need (pyproject.toml).
PLATFORM_MODULES = ("typer", "rich", "fastapi", "uvicorn", "grpc", "pyetcd", "jinja2", "httpx", "boto3", "torch")
PLATFORM_EXTRA = "stalwart[platform]"
# The worker side runs on Python 3.10; the control plane uses 3.11's standard library (datetime.UTC,
# Popen's process_group).
CONTROL_PLANE_PYTHON = (3, 11)


def missing_modules(names: tuple[str, ...] = PLATFORM_MODULES) -> list[str]:
    """The names among `names` that are not installed (found by their specs, nothing imported)."""
    return [name for name in names if find_spec(name) is None]


def _require_platform(prog: str) -> None:
    if sys.version_info < CONTROL_PLANE_PYTHON:
        print(
            f"{prog}: the control plane needs Python {'.'.join(map(str, CONTROL_PLANE_PYTHON))} or newer, this is "
            f"{sys.version.split()[0]} (the worker side runs on 3.10: docs/install.md)",
            file=sys.stderr,
        )
        sys.exit(1)
    missing = missing_modules()
    if missing:
        print(
            f"{prog}: this is a worker-side install of Stalwart (missing: {', '.join(missing)}); the command line "
            f"needs the control plane: pip install '{PLATFORM_EXTRA}'",
            file=sys.stderr,
        )
        sys.exit(1)


def stalwart() -> int:
    """`stalwart ...`"""
    _require_platform("stalwart")
    from stalwart.cli.main import main

    return main()


def kubectl_stalwart() -> int:
    """`kubectl stalwart ...` (kubectl runs kubectl-stalwart from PATH)."""
    _require_platform("kubectl-stalwart")
    from stalwart.cli.main import kubectl_main

    return kubectl_main()
