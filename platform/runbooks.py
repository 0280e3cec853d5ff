"""Runbooks: one markdown file per failure class, shared by the CLI, incidents, verdicts and the console.

A runbook id is a failure class of the signature database (`nccl_timeout`, `xid`, ...) or one of the
controller's classes (`hang`, `lost_node`, ...). Incidents carry the controller's `FailureEvent`
(`NaNLoss`, `Hang`, ...); `runbook_id` maps every spelling an on-call engineer or a record may use
onto the file name, so a link never depends on how the class was written.

Where the files are: `runbooks/` at the repository root is the one source. The package reaches it
as `stalwart.cli/runbooks`: in a checkout that is a symlink to the root folder, in a wheel the same
files are package data (pyproject: `"stalwart.cli" = ["runbooks/*.md"]`), so `importlib.resources`
finds them either way with no second copy to keep in sync. `STALWART_RUNBOOKS=/path` points at a
team's own folder instead.
"""

from __future__ import annotations

import os
import re
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

from pydantic import BaseModel

from stalwart.spec.model import FailureEvent
from stalwart.store.records import Incident

RUNBOOKS_ENV = "STALWART_RUNBOOKS"

# The controller's incident classes, by the runbook that explains them.
EVENT_RUNBOOKS: dict[FailureEvent, str] = {
    FailureEvent.MACHINE_FAULT: "machine_fault",
    FailureEvent.LOST_NODE: "lost_node",
    FailureEvent.WORKER_CRASH: "worker_crash",
    FailureEvent.USER_CODE_ERROR: "user_code_error",
    FailureEvent.NAN_LOSS: "nan_loss",
    FailureEvent.LOSS_SPIKE: "loss_spike",
    FailureEvent.HANG: "hang",
    FailureEvent.SLOWDOWN: "slowdown",
    FailureEvent.MFU_DECLINE: "mfu_decline",
    FailureEvent.PREFLIGHT_FAILED: "preflight_failed",
    FailureEvent.CODE_UPDATE: "code_update",
    FailureEvent.ELASTIC_GROW: "elastic_resize",
}

# Classes neither the signatures nor the incidents name, but that on-call meets: a checkpoint that
# fails its checksums, a NIC the network probe found down, a job whose nodes could not start.
EXTRA_RUNBOOKS = ("capacity_unavailable", "checkpoint_corruption", "nic_down", "nodes_died_before_joining")

# Words people type: `stalwart runbook show xid79`, `... oom-gpu`, `... nan`.
ALIASES: dict[str, str] = {
    "unknown": "worker_crash",  # a diagnosis verdict with no class: start where a plain crash starts
    "xid79": "xid",
    "xid_79": "xid",
    "ecc": "ecc_error",
    "nan": "nan_loss",
    "nccl": "nccl_error",
    "oom": "gpu_oom",
    "cuda_oom": "gpu_oom",
    "host_oom": "cpu_oom",
    "enospc": "disk_full",
    "sigsegv": "segfault",
    "sigbus": "bus_error",
    "lost": "lost_node",
    "preflight": "preflight_failed",
    "nodesdiedbeforejoining": "nodes_died_before_joining",  # the job's reason, as the status shows it
    "capacityunavailable": "capacity_unavailable",
    "elasticgrow": "elastic_resize",  # the incident class a grow records
    "elastic": "elastic_resize",
    "crash": "worker_crash",
    "checkpoint": "checkpoint_corruption",
    # The probes' machine-fault classes (stalwart.health), by the runbook that covers them.
    "gpu_lost": "xid",
    "gpu_missing": "xid",
    "gpu_not_responding": "xid",
    "ecc_uncorrectable": "ecc_error",
    "retired_pages_limit": "ecc_error",
    "row_remap_failure": "ecc_error",
    "ib_port_down": "nic_down",
    "nic_missing": "nic_down",
    "path_missing": "machine_fault",
    "nic_flap": "nic_down",
    "mount_missing": "machine_fault",
    "mount_read_only": "machine_fault",
    "kernel_panic": "machine_fault",
}


class UnknownRunbook(LookupError):
    """No runbook for that class; the message lists the ones there are."""


class Runbook(BaseModel):
    id: str
    title: str
    summary: str
    path: str  # where it lives in the repository: runbooks/<id>.md
    text: str | None = None


def runbooks_dir() -> Traversable:
    """The folder of runbook files: $STALWART_RUNBOOKS, else the packaged runbooks/ (see the module doc)."""
    override = os.environ.get(RUNBOOKS_ENV)
    if override:
        return Path(override)
    return files("stalwart.cli").joinpath("runbooks")


def runbook_id(name: str) -> str:
    """'NCCL-Timeout', 'nccl timeout', 'NaNLoss', 'Hang', 'xid79' -> the runbook id (not checked to exist)."""
    for event, rid in EVENT_RUNBOOKS.items():
        if name == event.value or name == event.name:
            return rid
    key = re.sub(r"[\s\-./]+", "_", name.strip()).lower()
    return ALIASES.get(key, key)


def runbook_for_incident(incident: Incident) -> str:
    """The incident's own runbook when the controller set one, else the verdict's, else its class's."""
    if incident.runbook:
        return runbook_id(incident.runbook)
    verdict_runbook = (incident.verdict or {}).get("runbook")
    if isinstance(verdict_runbook, str) and verdict_runbook:
        return runbook_id(verdict_runbook)
    return EVENT_RUNBOOKS[incident.failure_class]


def _parse(rid: str, text: str) -> Runbook:
    """Title: the first '# ' heading; summary: the first paragraph after it."""
    lines = text.splitlines()
    title = next((ln[2:].strip() for ln in lines if ln.startswith("# ")), rid)
    summary_lines: list[str] = []
    seen_title = False
    for ln in lines:
        if ln.startswith("# "):
            seen_title = True
            continue
        if not seen_title:
            continue
        if ln.strip() == "" and summary_lines:
            break
        if ln.strip() and not ln.startswith("#"):
            summary_lines.append(ln.strip())
        elif ln.startswith("#") and summary_lines:
            break
    return Runbook(id=rid, title=title, summary=" ".join(summary_lines), path=f"runbooks/{rid}.md", text=text)


def list_runbooks() -> list[Runbook]:
    folder = runbooks_dir()
    if not folder.is_dir():
        return []
    out = []
    for entry in folder.iterdir():
        if entry.name.endswith(".md") and entry.name.lower() != "readme.md":
            rid = entry.name[: -len(".md")]
            book = _parse(rid, entry.read_text(encoding="utf-8"))
            out.append(book.model_copy(update={"text": None}))
    return sorted(out, key=lambda b: b.id)


def load_runbook(name: str) -> Runbook:
    rid = runbook_id(name)
    entry = runbooks_dir().joinpath(f"{rid}.md")
    if not entry.is_file():
        known = ", ".join(b.id for b in list_runbooks()) or f"none found in {runbooks_dir()}"
        raise UnknownRunbook(f"no runbook for {name!r} (known: {known})")
    return _parse(rid, entry.read_text(encoding="utf-8"))
