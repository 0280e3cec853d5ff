"""Rendering a diagnosis verdict: suspects first, then the stack groups as a tree, outliers marked.

Works on the verdict's JSON form (a dict): that is what an incident stores, and it keeps the CLI
readable for verdicts written by an older or newer diagnosis service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from stalwart.ops.readable import nodes_of, rank_ranges

MAX_FRAMES = 8
MAX_EVIDENCE = 4


def _frames(frames: list[Any]) -> list[str]:
    text = [str(f) for f in frames if str(f).strip()]
    if len(text) <= MAX_FRAMES:
        return text
    return text[: MAX_FRAMES - 1] + [f"… {len(text) - MAX_FRAMES + 1} more frames"]


def stack_tree(groups: list[dict[str, Any]], rank_nodes: Mapping[int, str] | None = None) -> Tree:
    """One branch per group of ranks with the same stack; outliers first and in red."""
    tree = Tree(Text("stack groups (ranks with the same stack)", style="bold"), guide_style="dim")
    ordered = sorted(groups, key=lambda g: (not g.get("outlier"), g.get("count") or len(g.get("ranks") or [])))
    for g in ordered:
        ranks = [int(r) for r in g.get("ranks") or []]
        count = g.get("count") or len(ranks)
        label = Text()
        if g.get("outlier"):
            label.append("outlier ", style="bold red")
        label.append(f"{count} rank{'s' if count != 1 else ''}: {rank_ranges(ranks)}", style="bold")
        label.append(nodes_of(ranks, rank_nodes), style="cyan")
        if g.get("state") and g["state"] != "unknown":
            label.append(f"  {g['state']}", style="magenta")
        if g.get("signature"):
            label.append(f"  {g['signature']}", style="dim")
        branch = tree.add(label)
        for frame in _frames(list(g.get("frames") or [])):
            branch.add(Text(frame, style="red" if g.get("outlier") else ""))
    return tree


def suspects_table(suspects: list[Mapping[str, Any]]) -> Table:
    t = Table(box=box.SIMPLE, pad_edge=False, show_edge=False)
    for col in ("suspect", "score", "ranks", "why"):
        t.add_column(col, overflow="fold", no_wrap=col != "why")
    for s in sorted(suspects, key=lambda s: -(s.get("score") or 0)):
        score = s.get("score")
        t.add_row(
            Text(str(s.get("node")), style="bold red"),
            "-" if score is None else f"{score:.2f}",
            rank_ranges(int(r) for r in s.get("ranks") or []),
            "; ".join(str(r) for r in s.get("reasons") or []),
        )
    return t


def verdict_view(
    verdict: Mapping[str, Any], *, title: str = "verdict", rank_nodes: Mapping[int, str] | None = None
) -> Group:
    head = Text()
    head.append(str(verdict.get("failure_class") or "unknown"), style="bold red")
    if verdict.get("blame"):
        head.append(f" · blame {verdict['blame']}")
    confidence = verdict.get("confidence")
    if isinstance(confidence, (int, float)):
        head.append(f" · confidence {confidence:.2f}")
    if verdict.get("action") and verdict["action"] != "none":
        head.append(f" · action {verdict['action']}", style="bold")
    body: list[Any] = [head]
    group = verdict.get("group")
    if isinstance(group, Mapping):
        body.append(
            Text(
                f"suspect group: {group.get('kind')} group {group.get('index')}, ranks "
                f"{rank_ranges(int(r) for r in group.get('ranks') or [])} on "
                f"{', '.join(map(str, group.get('nodes') or [])) or '-'}",
                style="cyan",
            )
        )
    if verdict.get("summary"):
        body.append(Text(str(verdict["summary"])))
    suspects = [s for s in verdict.get("suspects") or [] if isinstance(s, Mapping)]
    body.append(suspects_table(suspects) if suspects else Text("no suspect node", style="yellow"))
    if verdict.get("runbook"):
        body.append(
            Text.assemble(
                ("runbook ", "bold"),
                (str(verdict["runbook"]), "bold cyan"),
                f"  stalwart runbook show {verdict['runbook']}",
            )
        )
    parts: list[Any] = [Panel(Group(*body), title=title, title_align="left", border_style="red")]
    groups = [g for g in verdict.get("stack_groups") or [] if isinstance(g, Mapping)]
    if groups:
        parts.append(stack_tree(groups, rank_nodes))  # type: ignore[arg-type]
    ranking = verdict.get("metric_ranking") or []
    if ranking:
        parts.append(Text("metric outliers: " + "; ".join(_describe(r) for r in list(ranking)[:5]), style="dim"))
    evidence = [str(e) for e in verdict.get("evidence") or []]
    for line in evidence[:MAX_EVIDENCE]:
        parts.append(Text(f"evidence: {line[:200]}{'…' if len(line) > 200 else ''}", style="dim"))
    if len(evidence) > MAX_EVIDENCE:
        parts.append(Text(f"evidence: … {len(evidence) - MAX_EVIDENCE} more (-o json has them all)", style="dim"))
    return Group(*parts)


def _describe(entry: Any) -> str:
    if isinstance(entry, Mapping) and "node" in entry and "metric" in entry:
        score = entry.get("score")
        z = f" z={score:.1f}" if isinstance(score, (int, float)) else ""
        windows = f" in {entry['windows']} windows" if entry.get("windows") else ""
        return f"{entry['node']} {entry['metric']}{z}{windows}"
    if isinstance(entry, Mapping):
        return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items())
    return str(entry)
