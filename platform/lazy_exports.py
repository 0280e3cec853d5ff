"""Lazy package exports: a package's public names load their module on first use.

Node agents and the data loader's process import `stalwart.checkpoint` and `stalwart.dataloader`
for a few light names; importing every submodule eagerly would pull in torch (seconds, and the
GIL while it loads).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`. `exports` maps a public name to the submodule
    that defines it, as `"module"` or `"module:attribute"` when the name differs there."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = exports[name].partition(":")
        value = getattr(importlib.import_module(f"{package}.{module}"), attribute or name)
        namespace[name] = value  # the next lookup finds it without coming here
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__
