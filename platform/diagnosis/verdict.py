"""Turning per-machine scores into a verdict: ranked suspects, the machines to evict, the action
and the runbook. One place decides what a score means, whatever evidence produced it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from stalwart.diagnosis.models import Action, Blame, MetricScore, StackGroup, Suspect, SuspectGroup, Verdict

FLAG_THRESHOLD = 0.5  # a suspect scored at least this is named for eviction
MAX_SUSPECTS = 256
MAX_EVIDENCE = 40


def combine(*scores: Mapping[str, float]) -> dict[str, float]:
    """Independent evidence adds up (noisy-or): two leads at 0.5 make 0.75."""
    out: dict[str, float] = {}
    for sc in scores:
        for node, s in sc.items():
            out[node] = 1.0 - (1.0 - out.get(node, 0.0)) * (1.0 - s)
    return {n: round(min(1.0, s), 3) for n, s in out.items()}


def rank_suspects(
    scores: Mapping[str, float], reasons: Mapping[str, Sequence[str]], ranks: Mapping[str, Sequence[int]] | None = None
) -> list[Suspect]:
    ordered = sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_SUSPECTS]
    return [
        Suspect(
            node=n,
            score=round(s, 3),
            reasons=list(reasons.get(n, []))[:32],
            ranks=sorted(set((ranks or {}).get(n, []))),
        )
        for n, s in ordered
    ]


def flagged(suspects: Sequence[Suspect]) -> list[str]:
    return [s.node for s in suspects if s.score >= FLAG_THRESHOLD]


def action_for(failure_class: str, blame: Blame, to_evict: Sequence[str]) -> Action:
    if to_evict:
        return "evict"
    if failure_class in ("nan_loss", "loss_spike"):
        return "rollback"
    if blame == "user_code":
        return "fail"
    if failure_class == "none":
        return "none"
    if failure_class == "slowdown":
        return "observe"
    return "stop_time_checks"


def make_verdict(
    *,
    job: str,
    generation: int,
    failure_class: str,
    blame: Blame,
    scores: Mapping[str, float],
    reasons: Mapping[str, Sequence[str]],
    suspect_ranks: Mapping[str, Sequence[int]] | None = None,
    group: SuspectGroup | None = None,
    stack_groups: Sequence[StackGroup] = (),
    metric_ranking: Sequence[MetricScore] = (),
    confidence: float,
    summary: str,
    evidence: Sequence[str] = (),
) -> Verdict:
    suspects = rank_suspects(scores, reasons, suspect_ranks)
    evict = flagged(suspects)
    if blame in ("node", "group") and not evict and failure_class not in ("hang", "slowdown"):
        blame = "job"  # nothing scored high enough to name a machine
    return Verdict(
        job=job,
        generation=generation,
        failure_class=failure_class,
        blame=blame,
        suspects=suspects,
        flagged=evict,
        group=group,
        stack_groups=list(stack_groups),
        metric_ranking=list(metric_ranking)[:MAX_SUSPECTS],
        confidence=round(max(0.0, min(1.0, confidence)), 3),
        action=action_for(failure_class, blame, evict),
        summary=summary[:1000],
        runbook=failure_class if failure_class != "none" else "none",
        evidence=[e[:500] for e in evidence][:MAX_EVIDENCE],
    )
