"""Imports every worker-side module of the installed `stalwart` and prints, as JSON, what each one
brought in: run by the packaging tests under any interpreter (3.10 to 3.12), with or without torch.

Standard library only: it runs in a worker-side venv that has nothing else.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys

# The worker side (docs/install.md): these modules, and every module under these packages.
WORKER_MODULES = ("stalwart.agents.worker_sdk", "stalwart.worker_contract", "stalwart.store.records")
WORKER_PACKAGES = ("stalwart.checkpoint", "stalwart.dataloader", "stalwart.integrations")
# The control plane's libraries: none may load in a training process.
CONTROL_PLANE = (
    "fastapi",
    "uvicorn",
    "starlette",
    "grpc",
    "etcd3",
    "pyetcd",
    "jinja2",
    "typer",
    "rich",
    "kubernetes",
    "kopf",
)
# Libraries a worker-side install may lack; a module that needs one is reported as such.
OPTIONAL = ("torch", "boto3", "botocore")
# The frameworks the integrations wrap are the user's choice, and some load these libraries themselves
# (transformers loads jinja2 for chat templates, lightning loads rich for its progress bar): those that
# are installed are imported first, so that only what Stalwart's own modules add is counted. Stalwart's
# direct imports of the control plane's libraries are the import contracts' job (.importlinter).
FRAMEWORKS = ("torch", "transformers", "accelerate", "lightning", "datasets", "megatron.core", "torchsnapshot")


def loaded(names: tuple[str, ...]) -> list[str]:
    return sorted(name for name in names if name in sys.modules)


def worker_side_modules() -> list[str]:
    found = list(WORKER_MODULES)
    for package in WORKER_PACKAGES:
        found.append(package)
        path = importlib.import_module(package).__path__
        for info in pkgutil.walk_packages(path, package + ".", onerror=lambda name: None):
            found.append(info.name)
    return found


def import_frameworks() -> list[str]:
    """The installed frameworks, imported; returns the control plane's libraries they loaded."""
    for name in FRAMEWORKS:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    return loaded(CONTROL_PLANE)


def main() -> None:
    report: dict[str, object] = {"python": list(sys.version_info[:2]), "modules": {}}
    report["frameworks_loaded"] = import_frameworks()
    modules: dict[str, dict[str, object]] = {}
    for name in worker_side_modules():
        before = set(loaded(CONTROL_PLANE))
        entry: dict[str, object] = {"ok": True}
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            entry = {"ok": False, "missing": (error.name or "").partition(".")[0], "error": str(error)}
        except Exception as error:  # reported, not raised: the test names the module
            entry = {"ok": False, "missing": None, "error": f"{type(error).__name__}: {error}"}
        entry["brought"] = sorted(set(loaded(CONTROL_PLANE)) - before)
        modules[name] = entry
    report["modules"] = modules
    report["control_plane_loaded"] = sorted(set(loaded(CONTROL_PLANE)) - set(report["frameworks_loaded"]))
    report["optional_loaded"] = loaded(OPTIONAL)
    report["stalwart_file"] = importlib.import_module("stalwart.worker_contract").__file__
    # What a user writes: the lazily exported names say which library they need when it is missing.
    lazy: dict[str, str | None] = {}
    for package, attribute in (("stalwart.checkpoint", "Checkpointer"), ("stalwart.dataloader", "open_loader")):
        try:
            getattr(importlib.import_module(package), attribute)
            lazy[f"{package}.{attribute}"] = None
        except ModuleNotFoundError as error:
            lazy[f"{package}.{attribute}"] = str(error)
    report["lazy"] = lazy
    print(json.dumps(report))


if __name__ == "__main__":
    main()
