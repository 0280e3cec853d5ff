"""A warm standby's copy of the job's newest in-memory checkpoint.

A standby that takes a lost node's ranks would otherwise read every byte of the restart's
checkpoint from other nodes' memory stores, on the critical path of the recovery. Instead its agent
copies the newest committed step into its own memory store while it waits, off that path, so the
restarted ranks on it read locally. Objects are copied whole and the commit marker (the manifest)
last, so a half-copied step is never taken for a committed one; older copies are dropped.

Pure HTTP against the memory stores: the agent that runs this never imports torch.
"""

from __future__ import annotations

from pydantic import BaseModel

from stalwart.checkpoint.errors import ManifestError
from stalwart.checkpoint.manifest import MANIFEST_NAME, Manifest, parse_step_dir, read_manifest
from stalwart.checkpoint.storage.base import StorageError
from stalwart.checkpoint.storage.memory import MemoryStorage


class MirrorResult(BaseModel):
    """What one sync did: the step held locally afterwards, and what it cost."""

    step: int | None = None
    copied_bytes: int = 0
    skipped: str | None = None  # why the newest step was not copied (too big, a source went away)


def sync_newest(
    local: str, sources: list[str], namespace: str, budget_bytes: int, token: str | None = None
) -> MirrorResult:
    """Copy the newest step committed on any of `sources` into the store at `local`, unless it is
    there already or bigger than `budget_bytes`; then drop the local copies of older steps.
    `token`: the job's (default: STALWART_CHECKPOINT_TOKEN)."""
    reader = MemoryStorage(local, None, namespace, nodes=[s for s in sources if s != local], token=token)
    local_only = MemoryStorage(local, None, namespace, token=token)
    newest = _newest_committed(reader)
    if newest is None:
        return MirrorResult()
    step, name, raw, manifest = newest
    copied = 0
    if local_only.read_bytes(f"{name}/{MANIFEST_NAME}") is None:  # not held yet
        if manifest.total_bytes > budget_bytes:
            return MirrorResult(
                skipped=f"step {step} holds {manifest.total_bytes} bytes, over the budget of {budget_bytes}"
            )
        try:
            for file in sorted(manifest.files()):
                data = reader.read_bytes(f"{name}/{file}")
                if data is None:
                    raise StorageError(f"{name}/{file} is gone from every store")
                local_only.write_bytes(f"{name}/{file}", data)
                copied += len(data)
            local_only.write_bytes(f"{name}/{MANIFEST_NAME}", raw)  # the commit marker, last
        except StorageError as exc:
            local_only.delete_dir(name)
            return MirrorResult(skipped=f"step {step}: {exc}")
    for older in local_only.list_dirs():
        if (older_step := parse_step_dir(older)) is not None and older_step < step:
            local_only.delete_dir(older)
    return MirrorResult(step=step, copied_bytes=copied)


def _newest_committed(reader: MemoryStorage) -> tuple[int, str, bytes, Manifest] | None:
    """The newest step with a readable commit marker on some store: (step, folder, marker, manifest)."""
    steps = sorted(
        ((step, name) for name in reader.list_dirs() if (step := parse_step_dir(name)) is not None), reverse=True
    )
    for step, name in steps:
        if (raw := reader.read_bytes(f"{name}/{MANIFEST_NAME}")) is not None:
            try:
                return step, name, raw, read_manifest(raw, f"memory:{name}/{MANIFEST_NAME}")
            except ManifestError:
                continue  # a corrupt marker: the step before it is the newest usable one
    return None
