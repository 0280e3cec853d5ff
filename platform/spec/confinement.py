"""Where a job's spec may point the platform on a node's file system.

`workingDir` and a checkpoint location that is a path (`checkpoint.uri`: a path or file:// URI) must
lie inside the job's folder (the job file's folder for `stalwart run`, the image's job folder on
Kubernetes) or inside a folder the administrator allows: STALWART_ALLOWED_PATHS, absolute paths
separated by ':' (set where `stalwart run`, the agents and the operator run). Paths are compared
with symlinks resolved, so a link inside the job's folder does not lead out of it. A checkpoint
folder must be inside one of them, not one of them itself: a replay writes beside it
(`<uri>-replay`). s3:// and mem:// locations pass through as they are.

This confines what the platform does on the job's behalf; it is no sandbox for the command itself,
which runs with the agent's rights (on Kubernetes, the pod's securityContext bounds those).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from stalwart.spec.messages import brief
from stalwart.spec.model import Role, TrainingJob

ALLOWED_PATHS_ENV = "STALWART_ALLOWED_PATHS"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class ConfinementError(ValueError):
    """A path of the spec leads outside the folders the job may use; the message says which and where."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def allowed_roots(raw: str | None) -> tuple[Path, ...]:
    """STALWART_ALLOWED_PATHS's folders (absolute paths separated by ':'; others are ignored)."""
    return tuple(Path(p) for p in (raw or "").split(os.pathsep) if p.strip() and os.path.isabs(p.strip()))


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


@dataclass(frozen=True)
class PathConfinement:
    job_dir: Path
    allowed: tuple[Path, ...] = ()

    @classmethod
    def from_env(cls, job_dir: Path | str, env: Mapping[str, str] | None = None) -> PathConfinement:
        env = os.environ if env is None else env
        return cls(Path(job_dir), allowed_roots(env.get(ALLOWED_PATHS_ENV)))

    def roots(self) -> list[Path]:
        return [_real(self.job_dir), *(_real(p) for p in self.allowed)]

    def _confine(self, field: str, value: str, *, strictly_inside: bool) -> Path:
        if "\x00" in value:
            raise ConfinementError(field, "a path with a NUL character")
        path = Path(value)
        resolved = _real(path if path.is_absolute() else self.job_dir / path)
        for root in self.roots():
            if resolved == root and not strictly_inside:
                return resolved
            if resolved != root and resolved.is_relative_to(root):
                return resolved
        where = "a folder inside" if strictly_inside else "inside"
        raise ConfinementError(
            field,
            f"{brief(value)} resolves to {brief(str(resolved), 120)}, which is not {where} the job's folder "
            f"{self.job_dir} or a folder in {ALLOWED_PATHS_ENV} "
            f"({os.pathsep.join(str(p) for p in self.allowed) or 'unset'})",
        )

    def working_dir(self, role: Role, field: str = "workingDir") -> Path:
        """The role's working directory: the job's folder by default."""
        if role.working_dir is None:
            return _real(self.job_dir)
        return self._confine(field, role.working_dir, strictly_inside=False)

    def checkpoint_uri(self, uri: str | None, field: str = "checkpoint.uri") -> str | None:
        """A local location as an absolute path; another storage tier's URI unchanged; None for none."""
        if uri is None:
            return None
        if uri.lower().startswith("file://"):
            return str(self._confine(field, uri[len("file://") :], strictly_inside=True))
        if _SCHEME.match(uri):
            return uri  # s3://, mem:// (the spec refuses other schemes)
        return str(self._confine(field, uri, strictly_inside=True))

    def problems(self, job: TrainingJob) -> list[str]:
        """Every path of the job that leads outside, as 'field: problem' lines."""
        out: list[str] = []
        for i, role in enumerate(job.spec.roles):
            try:
                self.working_dir(role, f"spec.roles[{i}].workingDir")
            except ConfinementError as exc:
                out.append(str(exc))
        try:
            self.checkpoint_uri(job.spec.checkpoint.uri, "spec.checkpoint.uri")
        except ConfinementError as exc:
            out.append(str(exc))
        return out
