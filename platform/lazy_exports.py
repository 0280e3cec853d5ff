"""Lazy package exports: a package's public names load their module on first use.

Node agents and the data loader's process import `stalwart.checkpoint` and `stalwart.dataloader`
for a few light names; importing every submodule eagerly would pull in torch (seconds, and the
GIL while it loads).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# Libraries that a worker-side install (docs/install.md) may lack, and how to get each: a name that
# needs one says so instead of a bare "No module named 'torch'" from deep in an import.
OPTIONAL_LIBRARIES = {
    "torch": "torch>=2.5 (the training image's own, or pip install 'stalwart[torch]')",
    "boto3": "pip install 'stalwart[s3]'",
    "botocore": "pip install 'stalwart[s3]'",
}


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`. `exports` maps a public name to the submodule
    that defines it, as `"module"` or `"module:attribute"` when the name differs there."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = exports[name].partition(":")
        try:
            value = getattr(importlib.import_module(f"{package}.{module}"), attribute or name)
        except ModuleNotFoundError as error:
            library = (error.name or "").partition(".")[0]
            if library not in OPTIONAL_LIBRARIES:
                raise
            raise ModuleNotFoundError(
                f"{package}.{name} needs {library}, which is not installed: {OPTIONAL_LIBRARIES[library]}",
                name=error.name,
            ) from error
        namespace[name] = value  # the next lookup finds it without coming here
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
