"""The loader's errors. Bad data is always reported with the file and the problem, never skipped."""

from __future__ import annotations

from pathlib import Path


class DataError(Exception):
    """Bad data or a bad data configuration. The message names the file or the setting at fault."""


class ShardError(DataError):
    """A token shard that is truncated, corrupted or not a shard at all."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem

    def __reduce__(self) -> tuple[type[ShardError], tuple[str, str]]:
        return (ShardError, (self.path, self.problem))


class StateMismatch(DataError):
    """A saved loader state that does not belong to this data, mixture history or seed."""


class ShadowLoaderUnavailable(RuntimeError):
    """The shadow loader did not deliver within the wait budget and local fallback is off."""
