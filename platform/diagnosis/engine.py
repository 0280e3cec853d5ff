"""The diagnosis engine: an evidence bundle in, a verdict out. A pure function (no I/O), so the
service, the CLI and the controller's in-process fallback all give the same answer.

`kind` picks the analysis; "auto" picks it from the evidence: a crash when some rank exited
non-zero, else a hang when there are stacks, else a slowdown when there are rounds of stacks,
else metric outliers.
"""

from __future__ import annotations

from typing import cast

from stalwart.diagnosis.hang import analyze_stacks
from stalwart.diagnosis.log_classify import classify_crash
from stalwart.diagnosis.metric_outliers import NAMED_SCORE, MetricFindings, metric_outliers
from stalwart.diagnosis.models import Blame, EvidenceBundle, RankStack, Topology, Verdict
from stalwart.diagnosis.parallel_groups import Layout, build_layout
from stalwart.diagnosis.slowdown import analyze_rounds
from stalwart.diagnosis.verdict import FLAG_THRESHOLD, combine, make_verdict

__all__ = ["diagnose", "resolve_kind"]


def resolve_kind(bundle: EvidenceBundle) -> str:
    if bundle.kind != "auto":
        return bundle.kind
    if any(log.exit_code not in (None, 0) for log in bundle.logs):
        return "crash"
    if bundle.stacks:
        return "hang"
    if bundle.rounds:
        return "slowdown"
    return "metrics"


def _layout(bundle: EvidenceBundle) -> Layout:
    placement: dict[int, str] = {}
    ranks: list[int] = []
    for s in [*bundle.stacks, *(s for rnd in bundle.rounds for s in rnd)]:
        ranks.append(s.rank)
        if s.node:
            placement[s.rank] = s.node
    for log in bundle.logs:
        ranks.append(log.rank)
        if log.node:
            placement[log.rank] = log.node
    topology = bundle.topology
    if topology is None:
        world = max(ranks, default=0) + 1
        topology = Topology(world_size=world, dp=world)
    return build_layout(topology, {r: n for r, n in placement.items() if r < topology.world_size})


def _pairs(bundle: EvidenceBundle, stacks: list[RankStack]) -> list[tuple[int, str]]:
    return [(s.rank, bundle.stack_text(s)) for s in stacks]


def _hang(bundle: EvidenceBundle, layout: Layout) -> Verdict:
    f = analyze_stacks(_pairs(bundle, bundle.stacks), layout)
    metrics = metric_outliers(bundle.metrics) if bundle.metrics else MetricFindings()
    scores = combine(f.node_scores, {n: s * 0.5 for n, s in metrics.node_scores.items()})
    top = max(scores.values(), default=0.0)
    blame: Blame = "node" if top >= FLAG_THRESHOLD else "group" if f.group is not None else "job"
    reasons = {n: [*f.reasons.get(n, []), *metrics.reasons.get(n, [])] for n in scores}
    evidence = [
        f"stack group {g.signature} ({g.count} ranks, {g.state}{', outlier' if g.outlier else ''}): "
        f"{' < '.join(g.frames[:4])}"
        for g in f.aggregation.groups[:12]
    ]
    return make_verdict(
        job=bundle.job,
        generation=bundle.generation,
        failure_class="hang",
        blame=blame,
        scores=scores,
        reasons=reasons,
        suspect_ranks=f.suspect_ranks,
        group=f.group,
        stack_groups=f.aggregation.groups,
        metric_ranking=metrics.ranking,
        confidence=f.confidence,
        summary=f"hang: {f.summary}",
        evidence=evidence,
    )


def _slowdown(bundle: EvidenceBundle, layout: Layout, with_rounds: bool) -> Verdict:
    rounds = [_pairs(bundle, rnd) for rnd in bundle.rounds] if with_rounds else []
    if with_rounds and bundle.stacks:
        rounds.append(_pairs(bundle, bundle.stacks))
    rf = analyze_rounds(rounds, layout) if rounds else None
    mf = metric_outliers(bundle.metrics) if bundle.metrics else MetricFindings()
    stack_scores = dict(rf.node_scores) if rf else {}
    if mf.metrics_seen:  # stacks are a lead, metrics the measurement: a lead the metrics do not back counts half
        stack_scores = {n: s if n in mf.node_scores else s * 0.5 for n, s in stack_scores.items()}
    # Metrics name a node alone at NAMED_SCORE; weaker, they only back the stacks' lead (a loaded
    # host's jitter can keep one metric barely out for a few windows).
    metric_scores = {n: s for n, s in mf.node_scores.items() if s >= NAMED_SCORE or n in stack_scores}
    scores = combine(stack_scores, metric_scores)
    reasons = {n: [*(rf.reasons.get(n, []) if rf else []), *mf.reasons.get(n, [])] for n in scores}
    parts = []
    if rf is not None:
        parts.append(rf.summary)
    if bundle.metrics:
        named = sorted(metric_scores, key=lambda n: -metric_scores[n])
        leaning = sorted(set(mf.node_scores) - set(metric_scores), key=lambda n: -mf.node_scores[n])
        parts.append(
            f"metrics point at {', '.join(named[:3])}"
            if named
            else f"metrics lean towards {', '.join(leaning[:3])}, below {NAMED_SCORE:g} alone"
            if leaning
            else f"no node is a persistent outlier in {mf.metrics_seen} metric(s)"
        )
    top = max(scores.values(), default=0.0)
    found = top >= FLAG_THRESHOLD
    failure_class = "slowdown" if found else "none"
    confidence = max(top, rf.confidence if rf else 0.0) if found else 0.6
    evidence = [f"{m.metric} on {m.node}: {m.score:.1f} robust z over {m.windows} windows" for m in mf.ranking[:10]]
    if rf is not None:
        evidence += [f"{n} flagged in {c} of {rf.rounds} stack rounds" for n, c in rf.node_counts.most_common(5)]
    return make_verdict(
        job=bundle.job,
        generation=bundle.generation,
        failure_class=failure_class,
        blame="node" if found else "none",
        scores=scores,
        reasons=reasons,
        suspect_ranks=rf.suspect_ranks if rf else {},
        group=rf.group if rf and found else None,
        metric_ranking=mf.ranking,
        confidence=confidence,
        summary=("slowdown: " if found else "no slowdown found: ") + "; ".join(parts),
        evidence=evidence,
    )


def _crash(bundle: EvidenceBundle, layout: Layout) -> Verdict:
    node_of = {r: layout.node_name(r) for r in range(layout.world)}
    c = classify_crash(bundle.logs, node_of, len(layout.nodes))
    return make_verdict(
        job=bundle.job,
        generation=bundle.generation,
        failure_class=c.failure_class,
        blame=cast(Blame, c.blame),
        scores=c.node_scores,
        reasons=c.reasons,
        suspect_ranks=c.suspect_ranks,
        confidence=c.confidence,
        summary=c.summary,
        evidence=c.evidence,
    )


def diagnose(bundle: EvidenceBundle) -> Verdict:
    """The verdict on one failure, from whatever evidence the bundle carries."""
    kind = resolve_kind(bundle)
    layout = _layout(bundle)
    if kind == "crash":
        return _crash(bundle, layout)
    if kind == "hang" and bundle.stacks:
        return _hang(bundle, layout)
    if kind in ("slowdown", "hang"):
        return _slowdown(bundle, layout, with_rounds=True)
    return _slowdown(bundle, layout, with_rounds=False)
