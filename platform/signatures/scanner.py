"""Scanning worker output against the signature database.

`LogScanner` is fed text incrementally, as the agent tails a worker's log, and emits one
`SignatureMatch` per matching line (its highest-priority class). `classify_exit` gives the final
verdict for an exited worker from its exit code and the tail of its log.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterable, Sequence

from pydantic import Field

from stalwart.health.records import Severity
from stalwart.signatures.loader import default_database
from stalwart.signatures.model import BlameScope, FailureClassSpec, SignatureDatabase
from stalwart.store.records import Record

MAX_LINE_CHARS = 4096  # a line longer than this (a progress bar without newlines) is cut here
EVIDENCE_CHARS = 500


class SignatureMatch(Record):
    failure_class: str
    scope: BlameScope
    severity: Severity
    priority: int
    line: str  # trimmed to EVIDENCE_CHARS
    line_number: int  # 1-based, counted from the start of the scanned stream
    rank: int | None = None
    matched_at: float = Field(default_factory=time.time)


class ExitVerdict(Record):
    exit_code: int | None
    signal: str | None = None  # SIGKILL, SIGSEGV, ... when the exit code says a signal ended it
    failure_class: str | None = None  # None: exited 0, or nothing matched
    scope: BlameScope | None = None
    severity: Severity | None = None
    evidence: list[SignatureMatch] = []
    reason: str


def signal_of(exit_code: int | None) -> signal.Signals | None:
    """The signal behind an exit code: -N from Popen, 128+N from a shell."""
    if exit_code is None:
        return None
    n = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else None
    if n is None:
        return None
    try:
        return signal.Signals(n)
    except ValueError:
        return None


class LogScanner:
    """Feed it a worker's output as it arrives; it returns the matches in what was fed.

    Partial lines are held until their newline; memory is bounded by MAX_LINE_CHARS.
    """

    def __init__(self, database: SignatureDatabase | None = None, rank: int | None = None) -> None:
        self.database = database or default_database()
        self.rank = rank
        self.line_number = 0
        self._classes = self.database.by_priority()
        self._partial = ""

    def feed(self, text: str) -> list[SignatureMatch]:
        """Scan a chunk of output (any size, possibly ending mid-line)."""
        data = self._partial + text
        lines = data.split("\n")
        self._partial = lines.pop()[:MAX_LINE_CHARS]
        out: list[SignatureMatch] = []
        for line in lines:
            m = self.feed_line(line)
            if m is not None:
                out.append(m)
        return out

    def flush(self) -> list[SignatureMatch]:
        """Scan the unterminated last line (when the stream ended)."""
        rest, self._partial = self._partial, ""
        m = self.feed_line(rest) if rest else None
        return [m] if m is not None else []

    def feed_line(self, line: str) -> SignatureMatch | None:
        self.line_number += 1
        line = line.rstrip("\r")[:MAX_LINE_CHARS]
        spec = self.classify_line(line)
        if spec is None:
            return None
        return SignatureMatch(
            failure_class=spec.name,
            scope=spec.scope,
            severity=spec.severity,
            priority=spec.priority,
            line=line[:EVIDENCE_CHARS],
            line_number=self.line_number,
            rank=self.rank,
        )

    def classify_line(self, line: str) -> FailureClassSpec | None:
        line = strip_rank_prefix(line)
        for spec in self._classes:  # highest priority first
            if spec.matches(line):
                return spec
        return None


def _lines_about(pid: int, lines: Iterable[str]) -> list[str]:
    """Kernel-log lines that name this process (OOM kills name the victim's pid)."""
    pat = re.compile(rf"(process\s+|pid[=:]\s*){pid}\b")
    return [ln for ln in lines if pat.search(ln)]


# torch.distributed's excepthook prints an uncaught exception with every line prefixed
# "[rank3]: " (torch >= 2.3, once a process group exists); torchrun's log tee adds "[default0]:".
_RANK_PREFIX = re.compile(r"^\[(?:rank\d+|default\d+)\]:\s?")


def strip_rank_prefix(line: str) -> str:
    return _RANK_PREFIX.sub("", line, count=1)


def classify_exit(
    exit_code: int | None,
    log_tail: Sequence[str],
    *,
    database: SignatureDatabase | None = None,
    kernel_log: Sequence[str] = (),
    pid: int | None = None,
    rank: int | None = None,
) -> ExitVerdict:
    """The failure class of an exited worker: the highest-priority class among the log tail's matches
    and the classes its exit code indicates.

    `kernel_log` lines (for instance the OOM killer's) count as evidence too; with `pid` only those
    naming that process do, so another process's OOM kill is not blamed on this worker.
    """
    db = database or default_database()
    sig = signal_of(exit_code)
    sig_name = sig.name if sig else None
    if exit_code == 0:
        return ExitVerdict(exit_code=0, reason="exited 0")
    scanner = LogScanner(db, rank=rank)
    matches = [m for line in log_tail if (m := scanner.feed_line(line)) is not None]
    kernel = _lines_about(pid, kernel_log) if pid is not None else list(kernel_log)
    kernel_scanner = LogScanner(db, rank=rank)
    matches += [m for line in kernel if (m := kernel_scanner.feed_line(line)) is not None]
    matched = {m.failure_class for m in matches}
    candidates: list[FailureClassSpec] = [c for c in db.classes if c.name in matched]
    for c in db.classes:
        if (
            exit_code is not None
            and exit_code in c.exit_codes
            and c not in candidates
            and not c.exit_codes_need_evidence
        ):
            candidates.append(c)
    if not candidates:
        how = f"killed by {sig_name}" if sig_name else f"exited {exit_code}"
        return ExitVerdict(exit_code=exit_code, signal=sig_name, reason=f"{how}; no known signature in the log tail")
    best = max(candidates, key=lambda c: c.priority)
    evidence = [m for m in matches if m.failure_class == best.name][:5]
    if evidence:
        reason = f"{best.name}: {evidence[0].line[:200]}"
    else:
        reason = f"{best.name}: exit code {exit_code}" + (f" ({sig_name})" if sig_name else "")
    return ExitVerdict(
        exit_code=exit_code,
        signal=sig_name,
        failure_class=best.name,
        scope=best.scope,
        severity=best.severity,
        evidence=evidence,
        reason=reason,
    )
