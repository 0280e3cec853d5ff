"""What a recovery restarts in a multi-role job: the failed roles alone (`restartScope: Role`), or
the whole job. The roles that are not restarted get no command: their workers keep their pids."""

from __future__ import annotations

from stalwart.spec import TrainingJobSpec
from stalwart.spec.model import RestartScope
from stalwart.store.records import JobState


def roles_of(state: JobState, nodes: list[str]) -> list[str]:
    """The roles whose slots `nodes` hold, in the job's order."""
    found = {r for n in nodes if (r := state.role_of(n)) is not None}
    return [r for r in state.roles if r in found]


def role_scope(failed: list[str], spec: TrainingJobSpec) -> list[str]:
    """The roles a recovery restarts alone, or [] for the whole job: a multi-role job's failure stays
    in its roles when each of them says `restartScope: Role`; one no role owns is the job's."""
    if len(spec.roles) < 2 or not failed:
        return []
    scopes = {r.name: r.restart_scope for r in spec.roles}
    return failed if all(scopes.get(r) is RestartScope.ROLE for r in failed) else []
