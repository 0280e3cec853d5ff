"""Environment variables a job's spec may not set for its workers.

The platform sets torchrun's variables and its own (STALWART_*, TORCHELASTIC_*): a user value would
mislead the worker about its rank or its job, or hand it another job's credentials. The dynamic
loader's (LD_*: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...) change what code every process of the
worker loads before Python starts. PYTHONPATH and the other PYTHON* variables are allowed: they
choose where the job's own code is found, which the command does anyway (a warm worker whose
PYTHON* variables differ from its pool's starts cold, so they always apply).
"""

from __future__ import annotations

# What torchrun (and so the agent) gives every worker.
TORCHRUN_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
)
PLATFORM_PREFIXES = ("STALWART_", "TORCHELASTIC_")
LOADER_PREFIX = "LD_"


def refusal(name: str) -> str | None:
    """Why `name` may not be set by a job's spec, or None if it may."""
    if name in TORCHRUN_NAMES:
        return f"{name} is set by the platform for each worker (torchrun's variables)"
    if name.startswith(PLATFORM_PREFIXES):
        return f"{name} is reserved for the platform (STALWART_* and TORCHELASTIC_* variables)"
    if name.startswith(LOADER_PREFIX):
        return f"{name} would change what the dynamic loader loads into every worker (LD_* variables)"
    return None
