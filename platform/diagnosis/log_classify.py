"""Classifying a crash from the ranks' exit codes and log tails, with the signature database.

Each exited rank gets the database's verdict (stalwart.signatures.classify_exit). Then across
ranks: peer-closed and collective timeouts are symptoms of another rank's failure, not causes; a
machine-scoped signature (Xid, ECC, disk full, a CUDA error on one rank) names its machine, unless
it shows on most machines at once, which is the code's doing; the same Python traceback on every
failing rank, or on ranks of several machines, is the user's code and blames no machine; NaN is
the job's (roll back). A rank that vanished (SIGKILL with nothing in its log) while its peers
report losing it points at its machine.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from stalwart.diagnosis.models import RankLog
from stalwart.signatures import BlameScope, ExitVerdict, classify_exit, default_database
from stalwart.signatures.scanner import strip_rank_prefix as strip_line_prefix

SYMPTOMS = frozenset({"peer_closed", "nccl_timeout", "nccl_error"})
HARDWARE = frozenset({"xid", "ecc_error"})  # never the code's fault, however many machines show it
WIDESPREAD_FRACTION = 0.5
_TB_START = "Traceback (most recent call last):"
_TB_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)')
_EXC_LINE = re.compile(
    r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)|KeyError|StopIteration)(?::\s*(.*))?$"
)
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


def strip_rank_prefix(lines: Sequence[str]) -> list[str]:
    """'[rank3]: Traceback (...)' -> 'Traceback (...)', line by line (see stalwart.signatures)."""
    return [strip_line_prefix(line) for line in lines]


@dataclass(frozen=True)
class Traceback:
    """A Python traceback, normalized: the exception type, its message without numbers, the
    innermost frames' function and file. Equal tracebacks on many ranks are one bug."""

    exc_type: str
    message: str
    frames: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.exc_type}: {self.message} @ {' < '.join(self.frames[:3])}"


@dataclass
class RankFinding:
    rank: int
    node: str
    exit_code: int | None
    verdict: ExitVerdict
    traceback: Traceback | None


@dataclass
class CrashFindings:
    failure_class: str
    blame: str  # node | job | user_code | none
    node_scores: dict[str, float] = field(default_factory=dict)
    reasons: dict[str, list[str]] = field(default_factory=dict)
    suspect_ranks: dict[str, list[int]] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    summary: str = ""
    confidence: float = 0.5
    per_rank: list[RankFinding] = field(default_factory=list)


def last_traceback(lines: Sequence[str]) -> Traceback | None:
    start = None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip().endswith(_TB_START):
            start = i
            break
    if start is None:
        return None
    frames: list[str] = []
    exc: tuple[str, str] | None = None
    for line in lines[start + 1 :]:
        m = _TB_FRAME.match(line)
        if m:
            frames.append(f"{m.group(2)} ({m.group(1).rsplit('/', 1)[-1]})")
            continue
        text = line.strip()
        m2 = _EXC_LINE.match(text)
        if m2 and not line.startswith((" ", "\t")):
            exc = (m2.group(1), _NUMBERS.sub("N", (m2.group(2) or "").strip())[:200])
            break
    if exc is None:
        return None
    return Traceback(exc_type=exc[0], message=exc[1], frames=tuple(reversed(frames)))


class _Classifier:
    """Caches each distinct (exit code, tail) verdict: thousands of ranks share a few tails."""

    def __init__(self) -> None:
        self.db = default_database()
        self.cache: dict[tuple[int | None, tuple[str, ...], tuple[str, ...]], tuple[ExitVerdict, Traceback | None]] = {}

    def __call__(self, log: RankLog) -> tuple[ExitVerdict, Traceback | None]:
        key = (log.exit_code, tuple(log.lines), tuple(log.kernel_log))
        hit = self.cache.get(key)
        if hit is None:
            lines = strip_rank_prefix(log.lines)
            verdict = classify_exit(log.exit_code, lines, database=self.db, kernel_log=log.kernel_log)
            hit = self.cache[key] = (verdict, last_traceback(lines))
        return hit


def _priority(failure_class: str | None) -> int:
    if failure_class is None:
        return -1
    try:
        return default_database().get(failure_class).priority
    except KeyError:
        return -1


def _symptom(f: RankFinding) -> bool:
    """A lost peer or a timeout; also an unlisted exception raised inside torch.distributed itself
    (a refused connection, a socket timeout): the communication failed because of another rank."""
    if f.verdict.failure_class in SYMPTOMS:
        return True
    if f.verdict.failure_class == "python_exception" and f.traceback is not None and f.traceback.frames:
        return f.traceback.frames[0].endswith(("(distributed_c10d.py)", "(c10d_logger.py)"))
    return False


def classify_crash(logs: Sequence[RankLog], node_of: dict[int, str], all_nodes: int) -> CrashFindings:
    """The crash's class and who is to blame, from every rank's exit and log tail."""
    classify = _Classifier()
    findings: list[RankFinding] = []
    for log in logs:
        failed = log.exit_code not in (None, 0)
        if not failed and not log.lines:
            continue
        verdict, tb = classify(log)
        if not failed and verdict.failure_class is None:
            continue
        node = log.node or node_of.get(log.rank, f"rank-{log.rank}")
        findings.append(RankFinding(rank=log.rank, node=node, exit_code=log.exit_code, verdict=verdict, traceback=tb))
    if not findings:
        return CrashFindings(failure_class="unknown", blame="none", summary="no rank failed", confidence=0.2)
    total_nodes = max(all_nodes, len({f.node for f in findings}))
    roots = [f for f in findings if not _symptom(f)]

    def nodes_of(fs: Sequence[RankFinding]) -> list[str]:
        return sorted({f.node for f in fs})

    # 1. machine-scoped signatures
    machine = [f for f in roots if f.verdict.scope is BlameScope.NODE]
    if machine:
        best = max(machine, key=lambda f: _priority(f.verdict.failure_class))
        cls = best.verdict.failure_class or "unknown"
        same = [f for f in machine if f.verdict.failure_class == cls]
        nodes = nodes_of(same)
        widespread = len(nodes) > 2 and len(nodes) >= WIDESPREAD_FRACTION * total_nodes
        if widespread and cls not in HARDWARE:
            out = CrashFindings(
                failure_class=cls,
                blame="user_code" if cls == "cuda_error" else "job",
                summary=f"{cls} on {len(nodes)} of {total_nodes} machines at once: the code or "
                "its configuration, not one machine",
                confidence=0.7,
            )
            out.evidence = [f"rank {f.rank}: {f.verdict.reason}" for f in same[:5]]
            out.per_rank = findings
            return out
        out = CrashFindings(
            failure_class=cls,
            blame="node",
            confidence=0.95 if len(nodes) <= 2 else 0.8,
            summary=f"{cls} on {', '.join(nodes[:5])}: {best.verdict.reason[:160]}",
        )
        for f in same:
            out.node_scores[f.node] = 0.95 if len(nodes) <= 2 else 0.75
            out.reasons.setdefault(f.node, []).append(f"rank {f.rank}: {f.verdict.reason[:200]}")
            out.suspect_ranks.setdefault(f.node, []).append(f.rank)
        out.evidence = [f"rank {f.rank} ({f.node}) exit {f.exit_code}: {f.verdict.reason[:200]}" for f in same[:10]]
        out.per_rank = findings
        return out

    # 2. NaN or a loss spike: the job's numbers, not a machine
    numeric = [f for f in roots if f.verdict.failure_class in ("nan_loss", "loss_spike")]
    if numeric:
        cls = max(numeric, key=lambda f: _priority(f.verdict.failure_class)).verdict.failure_class or ""
        out = CrashFindings(
            failure_class=cls,
            blame="job",
            confidence=0.9,
            summary=f"{cls} on {len(numeric)} rank(s): roll back to an earlier checkpoint",
        )
        out.evidence = [f"rank {f.rank}: {f.verdict.reason[:200]}" for f in numeric[:5]]
        out.per_rank = findings
        return out

    # 3. the user's code: the same exception on every failing rank, or on several machines
    user = [f for f in roots if f.verdict.scope is BlameScope.USER_CODE]
    if user:
        named = [f for f in user if f.verdict.failure_class != "python_exception"]
        if named:  # gpu_oom, cpu_oom: the job asked for more than the machine has
            cls = named[0].verdict.failure_class or "unknown"
            out = CrashFindings(
                failure_class=cls,
                blame="user_code",
                confidence=0.85,
                summary=f"{cls} on rank(s) {sorted(f.rank for f in named)[:8]}: {named[0].verdict.reason[:160]}",
            )
            out.evidence = [f"rank {f.rank}: {f.verdict.reason[:200]}" for f in named[:5]]
            out.per_rank = findings
            return out
        keys = Counter(f.traceback.key for f in user if f.traceback is not None)
        top_key, top_n = keys.most_common(1)[0] if keys else ("", 0)
        same = [f for f in user if f.traceback is not None and f.traceback.key == top_key]
        nodes = nodes_of(same)
        first = same[0] if same else user[0]
        what = (
            f"{first.traceback.exc_type}: {first.traceback.message[:120]}"
            if first.traceback
            else first.verdict.reason[:160]
        )
        if len(same) >= 2 and (len(nodes) >= 2 or len(same) == len(user)):
            out = CrashFindings(
                failure_class="user_code_error",
                blame="user_code",
                confidence=0.95,
                summary=f"the same exception on {len(same)} ranks across {len(nodes)} machine(s): {what}",
            )
        else:
            out = CrashFindings(
                failure_class="user_code_error",
                blame="user_code",
                confidence=0.6,
                summary=f"rank {first.rank} alone raised {what}; the others lost their peer",
            )
            out.node_scores[first.node] = 0.3
            out.reasons[first.node] = [f"only rank {first.rank} raised; suspect the machine if it recurs there"]
            out.suspect_ranks[first.node] = [first.rank]
        out.evidence = [f"rank {f.rank} ({f.node}): {what}" for f in same[:5]] or [what]
        if first.traceback:
            out.evidence.append("traceback: " + " < ".join(first.traceback.frames[:6]))
        out.per_rank = findings
        return out

    # 4. a job-scoped cause on some ranks (segfault, bus error): restart and run the stop-time checks
    job = [f for f in roots if f.verdict.failure_class is not None]
    if job:
        best = max(job, key=lambda f: _priority(f.verdict.failure_class))
        cls = best.verdict.failure_class or "unknown"
        same = [f for f in job if f.verdict.failure_class == cls]
        out = CrashFindings(
            failure_class=cls,
            blame="job",
            confidence=0.6,
            summary=f"{cls} on rank(s) {sorted(f.rank for f in same)[:8]}: {best.verdict.reason[:160]}",
        )
        for f in same:
            out.node_scores[f.node] = 0.4
            out.reasons.setdefault(f.node, []).append(f"rank {f.rank}: {f.verdict.reason[:200]}")
            out.suspect_ranks.setdefault(f.node, []).append(f.rank)
        out.evidence = [f"rank {f.rank} ({f.node}): {f.verdict.reason[:200]}" for f in same[:10]]
        out.per_rank = findings
        return out

    # 5. ranks that died with no word (SIGKILL, an exit code nothing explains)
    silent = roots
    if silent:
        nodes = nodes_of(silent)
        how = ", ".join(f"rank {f.rank} {f.verdict.reason}" for f in silent[:3])
        if len(nodes) <= 2:
            out = CrashFindings(
                failure_class="unknown",
                blame="node",
                confidence=0.6,
                summary=f"{how}; the other ranks lost it: its machine is the suspect",
            )
            for f in silent:
                out.node_scores[f.node] = 0.6
                out.reasons.setdefault(f.node, []).append(
                    f"rank {f.rank} died first with nothing in its log ({f.verdict.reason})"
                )
                out.suspect_ranks.setdefault(f.node, []).append(f.rank)
        else:
            out = CrashFindings(
                failure_class="unknown",
                blame="job",
                confidence=0.3,
                summary=f"{len(silent)} ranks on {len(nodes)} machines died with no known signature",
            )
        out.evidence = [f"rank {f.rank} ({f.node}) exit {f.exit_code}: {f.verdict.reason}" for f in silent[:10]]
        out.per_rank = findings
        return out

    # 6. only symptoms: a timeout or a lost peer everywhere, the cause is elsewhere (a hang: get the stacks)
    worst = max(findings, key=lambda f: _priority(f.verdict.failure_class)).verdict.failure_class
    out = CrashFindings(
        failure_class=worst or "unknown",
        blame="job",
        confidence=0.4,
        summary=f"only symptoms ({worst}) on {len(findings)} ranks: the cause is on another rank or "
        "the network; capture stacks and run the stop-time checks",
    )
    out.evidence = [f"rank {f.rank}: {f.verdict.reason[:200]}" for f in findings[:5]]
    out.per_rank = findings
    return out
