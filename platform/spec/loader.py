"""Load a TrainingJob from YAML, with errors that name the file, the field path and the problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from stalwart.spec.model import TrainingJob


class SpecError(ValueError):
    """A job file that cannot be used; the message is meant for the person who wrote it."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: invalid TrainingJob:\n{lines}")


def _field_path(loc: tuple[int | str, ...]) -> str:
    """('spec', 'roles', 0, 'replicas') -> 'spec.roles[0].replicas'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(document)"


def _describe(error: ErrorDetails) -> str:
    path = _field_path(tuple(error["loc"]))
    msg = error["msg"]
    if error["type"] == "missing":
        return f"{path}: required field is missing"
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown field"
    msg = msg.removeprefix("Value error, ")
    if "input" in error and error["type"] not in ("model_type", "dict_type"):
        return f"{path}: {msg} (got {error['input']!r})"
    return f"{path}: {msg}"


def parse_job(document: Any, source: str = "<job>") -> TrainingJob:
    """Validate an already-parsed document (e.g. a CR body) as a TrainingJob."""
    if not isinstance(document, dict):
        raise SpecError(source, [f"(document): expected a mapping, got {type(document).__name__}"])
    try:
        return TrainingJob.model_validate(document)
    except ValidationError as exc:
        raise SpecError(source, [_describe(e) for e in exc.errors()]) from None


def load_job(path: str | Path) -> TrainingJob:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(str(path), [f"cannot read file: {exc.strerror}"]) from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(str(path), [f"{where}not valid YAML: {problem}"]) from None
    return parse_job(document, str(path))
