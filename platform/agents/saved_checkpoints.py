"""The node's newest committed checkpoints, from its ranks' save reports, for the heartbeat.

Every rank of a world reports the same save (the engine's commit is the coordinator's, broadcast to
all), so the agent merges its ranks' reports per step: the heartbeat carries a short list, not one
entry per rank. The list is bounded but longer than one: a job that saves more than once per
heartbeat interval still gets every step into the controller's catalog.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from stalwart.store.records import ProgressReport, SavedCheckpoint

KEPT = 8  # saves per heartbeat: more than a heartbeat interval ever holds


def without_secrets(uri: str) -> str:
    """A checkpoint URI as the catalog may show it: no user, password or query (an S3 endpoint's
    query may carry a key)."""
    parts = urlsplit(uri)
    if not parts.scheme or not parts.netloc:
        return uri.split("?", 1)[0]
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class SavedCheckpoints:
    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._saves: dict[tuple[int, int | None], SavedCheckpoint] = {}
        self.default_location: str | None = None  # the URI the workers were given, for bare reports

    def record(self, report: ProgressReport) -> None:
        """Note a committed save (a report without timings counts as one: report_checkpoint)."""
        timing = report.checkpoint
        if report.kind != "checkpoint" or (timing is not None and (timing.operation != "save" or not timing.committed)):
            return
        key = (report.step, report.generation)
        known = self._saves.get(key)
        total = timing.total_bytes if timing is not None else None
        location = (timing.location if timing is not None else None) or self.default_location
        if known is None:
            self._saves[key] = SavedCheckpoint(
                step=report.step,
                generation=report.generation,
                committed_at=report.sent_at or 0.0,
                tiers=list(timing.tiers) if timing is not None else [],
                total_bytes=total,
                location=location,
            )
        else:
            known.committed_at = min(known.committed_at, report.sent_at) if report.sent_at else known.committed_at
            known.total_bytes = max(known.total_bytes or 0, total or 0) or None
            known.tiers = known.tiers or (list(timing.tiers) if timing is not None else [])
            known.location = known.location or location
        for old in sorted(self._saves, key=lambda k: (k[1] or 0, k[0]))[: -self.kept]:
            del self._saves[old]

    def newest(self) -> list[SavedCheckpoint]:
        """Newest first (by generation, then step); copies, for the heartbeat thread."""
        ordered = sorted(self._saves.values(), key=lambda s: (s.generation or 0, s.step), reverse=True)
        return [s.model_copy() for s in ordered]
