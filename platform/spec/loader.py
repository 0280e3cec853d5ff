"""Load a TrainingJob from YAML, with errors that name the file, the field path and the problem.

A job document is bounded before anything expensive happens to it: the file's size before it is
parsed (MAX_SPEC_BYTES), its nesting depth and its size with every YAML alias expanded
(MAX_DOCUMENT_BYTES, roughly its size as JSON, which is how etcd and Kubernetes store it), both
measured on the parser's event stream, so a "billion laughs" document is refused before it is built.
The same bounds apply to a document that arrives parsed (a custom resource's body). Error messages
quote at most a few dozen characters of any value.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from stalwart.spec.confinement import PathConfinement
from stalwart.spec.messages import brief, clip
from stalwart.spec.model import TrainingJob

MAX_SPEC_BYTES = 1024 * 1024  # the file as written
MAX_DOCUMENT_BYTES = 1024 * 1024  # as stored (JSON), aliases expanded: etcd takes 1.5 MiB requests
MAX_DEPTH = 32  # a TrainingJob nests 6 deep
MAX_PROBLEMS = 20

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present


class SpecError(ValueError):
    """A job file that cannot be used; the message is meant for the person who wrote it."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        shown = problems[:MAX_PROBLEMS]
        more = [f"(and {len(problems) - MAX_PROBLEMS} more)"] if len(problems) > MAX_PROBLEMS else []
        lines = "\n".join(f"  - {p}" for p in shown + more)
        super().__init__(f"{source}: invalid TrainingJob:\n{lines}")


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"


def _field_path(loc: tuple[int | str, ...]) -> str:
    """('spec', 'roles', 0, 'replicas') -> 'spec.roles[0].replicas'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{clip(part, 64)}" if out else clip(part, 64)
    return out or "(document)"


def _describe(error: ErrorDetails) -> str:
    path = _field_path(tuple(error["loc"]))
    msg = error["msg"]
    if error["type"] == "missing":
        return f"{path}: required field is missing"
    if error["type"] == "extra_forbidden":
        return f"{path}: unknown field"
    msg = clip(msg.removeprefix("Value error, "), 400)
    value = error.get("input")
    if "input" in error and isinstance(value, str | bytes | bool | int | float) and error["type"] != "value_error":
        return f"{path}: {msg} (got {brief(value)})"
    return f"{path}: {msg}"


# -- bounds ----------------------------------------------------------------------------------------
class _Bound(ValueError):
    pass


def _scalar_size(value: object) -> int:
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, bytes):
        return len(value) * 4 // 3 + 2
    return len(str(value))


def check_document(document: object, max_bytes: int = MAX_DOCUMENT_BYTES, max_depth: int = MAX_DEPTH) -> None:
    """Refuse (ValueError) a parsed document deeper than `max_depth` or larger than `max_bytes` as
    JSON. Iterative and stops at the bound, so shared (aliased) or cyclic parts cost no more."""
    size = 0
    stack: list[tuple[object, int]] = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise _Bound(f"nested more than {max_depth} levels deep")
        if isinstance(node, Mapping):
            size += 2 + 2 * len(node)
            for key, value in node.items():
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))
        elif isinstance(node, list | tuple | set):
            size += 2 + len(node)
            stack.extend((item, depth + 1) for item in node)
        else:
            size += _scalar_size(node)
        if size > max_bytes:
            raise _Bound(f"larger than {_mib(max_bytes)} as JSON (aliases expanded)")


def _events(text: str, max_depth: int) -> Iterator[yaml.Event]:
    loader = _Loader(text)
    try:
        while loader.check_event():
            yield loader.get_event()
    except yaml.YAMLError as exc:
        # PyYAML >= 6.0.4 has its own nesting limit (1,000), met in the scanner's look-ahead before the
        # first event: the document is then deeper than ours too, and is refused the same way.
        if "nesting depth" in str(getattr(exc, "problem", "") or ""):
            raise _Bound(f"nested more than {max_depth} levels deep") from None
        raise
    finally:
        loader.dispose()


def check_yaml(text: str, max_bytes: int = MAX_DOCUMENT_BYTES, max_depth: int = MAX_DEPTH) -> None:
    """The bounds of check_document, measured on the YAML parser's events before anything is built:
    an alias counts the size of what it names, every time it appears; a recursive alias is refused."""
    done: dict[str, int] = {}  # anchor -> expanded size of its node
    open_anchors: list[str | None] = []  # one per open collection
    sizes: list[int] = [0]  # running size of each open collection (the outermost: the stream)
    for event in _events(text, max_depth):
        if isinstance(event, yaml.AliasEvent):
            anchor = event.anchor or ""
            if anchor in open_anchors:
                raise _Bound(f"alias *{clip(anchor, 64)} refers to a node that contains it")
            if anchor not in done:
                raise _Bound(f"alias *{clip(anchor, 64)} refers to no anchor before it")
            sizes[-1] += done[anchor] + 1
        elif isinstance(event, yaml.ScalarEvent):
            n = len(event.value) + 3
            sizes[-1] += n
            if event.anchor is not None:
                done[event.anchor] = n
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(sizes) > max_depth + 1:
                raise _Bound(f"nested more than {max_depth} levels deep")
            open_anchors.append(event.anchor)
            sizes.append(2)
        elif isinstance(event, yaml.CollectionEndEvent):
            opened, n = open_anchors.pop(), sizes.pop()
            if opened is not None:
                done[opened] = n
            sizes[-1] += n
        if sum(sizes) > max_bytes:
            raise _Bound(f"larger than {_mib(max_bytes)} once its aliases are expanded")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = str(getattr(exc, "problem", None) or exc)
    return f"{where}not valid YAML: {clip(problem)}"


# -- loading ---------------------------------------------------------------------------------------
def parse_job(document: Any, source: str = "<job>") -> TrainingJob:
    """Validate an already-parsed document (e.g. a CR body) as a TrainingJob."""
    if not isinstance(document, dict):
        raise SpecError(source, [f"(document): expected a mapping, got {brief(document)}"])
    try:
        check_document(document)
    except _Bound as exc:
        raise SpecError(source, [f"(document): {exc}"]) from None
    try:
        return TrainingJob.model_validate(document)
    except ValidationError as exc:
        raise SpecError(source, [_describe(e) for e in exc.errors()]) from None


def parse_yaml(text: str, source: str = "<job>") -> Any:
    """The document of one YAML text, within the bounds (SpecError otherwise)."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(source, [f"(document): {len(text):,} characters; a TrainingJob may be {_mib(MAX_SPEC_BYTES)}"])
    try:
        check_yaml(text)
        return yaml.load(text, Loader=_Loader)  # a safe loader: libyaml's or PyYAML's
    except _Bound as exc:
        raise SpecError(source, [f"(document): {exc}"]) from None
    except yaml.YAMLError as exc:
        raise SpecError(source, [_yaml_problem(exc)]) from None
    except (ValueError, RecursionError, OverflowError) as exc:  # e.g. an integer of 5,000 digits
        raise SpecError(source, [f"(document): a value cannot be read: {clip(str(exc), 120)}"]) from None


def read_job_file(path: Path) -> str:
    """The file's text, refused past MAX_SPEC_BYTES without reading further (a FIFO or /dev/zero too)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_SPEC_BYTES:
                size = os.fstat(f.fileno()).st_size
                raise SpecError(str(path), [f"the file is {size:,} bytes; a TrainingJob may be {_mib(MAX_SPEC_BYTES)}"])
            data = f.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(str(path), [f"cannot read file: {exc.strerror}"]) from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(str(path), [f"the file is larger than {_mib(MAX_SPEC_BYTES)}, the limit for a TrainingJob"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(str(path), [f"not UTF-8 text (byte {exc.start})"]) from None


def load_job(path: str | Path, confinement: PathConfinement | None = None) -> TrainingJob:
    """The job in a YAML file, its paths confined to the file's folder and STALWART_ALLOWED_PATHS
    (or to `confinement`)."""
    path = Path(path)
    job = parse_job(parse_yaml(read_job_file(path), str(path)), str(path))
    return confined(job, confinement or PathConfinement.from_env(path.resolve().parent), str(path))


def confined(job: TrainingJob, confinement: PathConfinement, source: str = "<job>") -> TrainingJob:
    """The job, if its paths stay inside the folders `confinement` allows (SpecError otherwise)."""
    problems = confinement.problems(job)
    if problems:
        raise SpecError(source, problems)
    return job
