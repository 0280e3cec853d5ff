"""The worker side installed alone, as a user's training image gets it (docs/install.md): a clean venv
of another Python (3.12, and 3.10 for the imports), `pip install` of this repository with no extras and
no torch. Its modules import without the control plane; the console scripts say which extra they need;
and a real `stalwart run` (from the main venv) of a job whose command runs that venv's python sees the
steps its worker SDK reports."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import stalwart_run
from support.paths import REPO

pytestmark = pytest.mark.e2e

PROBE = Path(__file__).with_name("probe_worker_side.py")
SCRIPT = Path(__file__).with_name("report_steps.py")
UV = Path(sys.executable).with_name("uv")
STEPS = 5
# Libraries a worker-side install lacks: torch and boto3 (their extras), and the frameworks that the
# integrations wrap (the user's image has the ones it uses).
OPTIONAL = {"torch", "boto3", "botocore", "transformers", "accelerate", "lightning", "datasets", "megatron"}
OPTIONAL |= {"torchsnapshot", "pytorch_lightning", "deepspeed"}


def interpreter(version: str) -> str | None:
    """pyenv's build of `version`, else one on PATH."""
    pyenv = sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}"))
    return str(pyenv[-1]) if pyenv else shutil.which(f"python{version}")


@pytest.fixture(scope="module")
def venvs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def worker_venv(venvs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, version: str) -> Path:
    """A venv of Python `version` with `pip install <repository>` (no extras) in it: made once per module."""
    if version in venvs:
        return venvs[version]
    python = interpreter(version)
    if python is None:
        pytest.skip(f"no Python {version} interpreter here (pyenv's or python{version} on PATH)")
    venv = tmp_path_factory.mktemp(f"worker-py{version}") / "venv"
    subprocess.run([str(UV), "venv", "--quiet", "--python", python, str(venv)], check=True, timeout=300)
    install = [str(UV), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(REPO)]
    proc = subprocess.run(install, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    venvs[version] = venv
    return venv


@pytest.mark.parametrize("version", ["3.10", "3.12"])
def test_the_worker_side_imports_without_torch_or_the_control_plane(
    version: str, venvs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = worker_venv(venvs, tmp_path_factory, version)
    proc = subprocess.run([str(venv / "bin" / "python"), str(PROBE)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["python"] == [int(part) for part in version.split(".")]
    assert report["stalwart_file"].startswith(str(venv)), report["stalwart_file"]  # the installed copy
    assert report["frameworks_loaded"] == [] and report["optional_loaded"] == []  # no torch here
    assert report["control_plane_loaded"] == []
    modules = report["modules"]
    for name in ("stalwart.agents.worker_sdk", "stalwart.worker_contract", "stalwart.checkpoint.storage"):
        assert modules[name]["ok"], modules[name]
    # What fails, fails only for a library the base install leaves out, and names it.
    broken = {name: entry for name, entry in modules.items() if not entry["ok"] and entry["missing"] not in OPTIONAL}
    assert broken == {}
    assert any(not entry["ok"] and entry["missing"] == "torch" for entry in modules.values())
    assert "pip install 'stalwart[s3]'" in modules["stalwart.checkpoint.storage.s3"]["error"]
    for name, message in report["lazy"].items():
        assert message is not None and "needs torch" in message and "stalwart[torch]" in message, name
    absent = "import importlib.util as u, sys; print([n for n in sys.argv[1:] if u.find_spec(n)])"
    libraries = ["torch", "fastapi", "uvicorn", "starlette", "grpc", "pyetcd", "jinja2", "typer", "rich", "kopf"]
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", absent, *libraries], capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


@pytest.mark.parametrize("script", ["stalwart", "kubectl-stalwart"])
def test_the_console_scripts_name_the_extra_in_one_line(
    script: str, venvs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = worker_venv(venvs, tmp_path_factory, "3.12")
    proc = subprocess.run([str(venv / "bin" / script), "run", "job.yaml"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{script}: ") and "pip install 'stalwart[platform]'" in lines[0]


def test_a_worker_side_install_reports_steps_to_a_running_agent(
    tmp_path: Path, venvs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The job's command names the 3.12 venv's interpreter by its path: a bare `python` would be the
    agent's own (the launcher puts the platform's bin folder first on PATH). The script and the
    working folder are the job's folder, which needs no STALWART_ALLOWED_PATHS (docs/security.md).
    The script writes where it ran, so the test knows the worker was that venv's, not the agent's."""
    venv = worker_venv(venvs, tmp_path_factory, "3.12")
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    job = {
        "apiVersion": "stalwart.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "worker-install"},
        "spec": {
            "roles": [
                {
                    "name": "trainer",
                    "replicas": 1,
                    "processesPerNode": 1,
                    "command": [str(venv / "bin" / "python"), SCRIPT.name, str(STEPS)],
                    "workingDir": ".",
                }
            ],
            # Cold starts: the warm pool runs a `.../python script.py` command in the agent's own
            # interpreter, whatever folder that python is in (stalwart.agents.warm_start.warm_eligible).
            "faultTolerance": {"heartbeatIntervalSeconds": 0.5, "preflight": False},
            "standbys": {"minimum": 0},
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    stalwart = [str(Path(sys.executable).with_name("stalwart"))]  # the main venv's console script
    code, result, output = stalwart_run.run_job(tmp_path, stalwart, path)
    assert code == 0, output
    assert result["phase"] == "Succeeded", output
    snap = result["snapshot"]
    assert snap["step"] == STEPS and snap["restarts"] == 0, snap
    evidence = json.loads((tmp_path / "worker-evidence.json").read_text())
    assert evidence["python"] == [3, 12] and evidence["executable"].startswith(str(venv)), evidence
    assert evidence["stalwart"].startswith(str(venv)), evidence  # the venv's install, not the repository
    assert evidence["importable"] == [] and evidence["loaded"] == [], evidence
