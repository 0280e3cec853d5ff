"""Judging the checks' bus bandwidth: a node whose links are slow fails, as one that computes wrong.

The floor is the spec's (`roles[].health.minBusBandwidthGbps`, per node), else half the median of
the node's peers in the same kind of collective. The peers' median is judged on GPUs only (NCCL):
on CPU the collectives run over loopback, where what a rank measures is the CPU scheduler (a loaded
machine), not a link. A node fails when every collective of a kind its ranks ran was below the
floor (one slow op among several is noise); with two nodes, a slow link between them fails both,
as nothing tells which end is slow.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median

from stalwart.health.collective_records import RankReport

PEER_FRACTION = 0.5  # below this fraction of the peers' median is slow
PEER_JUDGED_BACKENDS = frozenset({"nccl"})


def slow_links(
    reports: list[RankReport],
    floors: Mapping[int, float] | None = None,
) -> dict[int, list[str]]:
    """Per node index, why its bandwidth fails (nodes that pass are left out). `floors`: the spec's
    floor per node (GB/s, nccl-tests' busbw); a node without one is judged against its peers."""
    floors = floors or {}
    by_kind: dict[str, list[tuple[RankReport, float, list[int]]]] = {}
    for r in reports:
        for c in r.checks:
            if c.passed and c.bus_bandwidth_gbps is not None:
                by_kind.setdefault(c.name, []).append((r, c.bus_bandwidth_gbps, c.group))
    reasons: dict[int, list[str]] = {}
    for kind, measured in sorted(by_kind.items()):
        peers = median(bw for _, bw, _ in measured)
        per_node: dict[int, list[tuple[float, list[int]]]] = {}
        for r, bw, group in measured:
            per_node.setdefault(r.node, []).append((bw, group))
        for node, values in sorted(per_node.items()):
            floor, whose = _floor(node, floors, peers, {r.backend for r, _, _ in measured})
            if floor is None or max(bw for bw, _ in values) >= floor:
                continue
            worst, group = min(values)
            reasons.setdefault(node, []).append(
                f"{kind} over {group}: bus bandwidth {worst:.2f} GB/s, below {whose} {floor:.2f} GB/s"
            )
    return reasons


def _floor(node: int, floors: Mapping[int, float], peers: float, backends: set[str]) -> tuple[float | None, str]:
    if node in floors:
        return floors[node], "the spec's floor"
    if backends and backends <= PEER_JUDGED_BACKENDS:
        return PEER_FRACTION * peers, f"half its peers' median ({peers:.2f} GB/s):"
    return None, ""
