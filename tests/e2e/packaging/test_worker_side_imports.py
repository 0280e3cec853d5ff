"""The worker side imports no control plane: every module under the checkpoint engine, the data loader
and the framework integrations (found by walking the packages, so new ones are covered), the worker SDK
and what they import, loaded in a fresh interpreter (probe_worker_side.py, beside this file). The
frameworks the integrations wrap load first, so what they load themselves (transformers: jinja2,
Lightning: rich) is theirs; Stalwart's own imports of those libraries are .importlinter's to forbid.
An end-to-end test: the interpreter imports every framework (transformers, Lightning, Megatron...),
some 15 CPU-seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

PROBE = Path(__file__).with_name("probe_worker_side.py")


def test_no_worker_side_module_loads_the_control_plane() -> None:
    proc = subprocess.run([sys.executable, str(PROBE)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    modules = report["modules"]
    # The walk found the packages' modules, not just the packages.
    for expected in ("stalwart.checkpoint.engine", "stalwart.checkpoint.storage.s3", "stalwart.dataloader.loader"):
        assert expected in modules
    failed = {name: entry["error"] for name, entry in modules.items() if not entry["ok"]}
    assert failed == {}, failed  # this venv has torch and boto3: every module imports
    brought = {name: entry["brought"] for name, entry in modules.items() if entry["brought"]}
    assert brought == {}, f"worker-side modules that load the control plane's libraries: {brought}"
    assert report["control_plane_loaded"] == []
