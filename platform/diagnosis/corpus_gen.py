"""Expanding captured corpus cases to thousands of ranks, for the localization test and the benchmark.

Real captures stop at 16 ranks on one machine; the code paths that matter at scale do not. A hang
case is grown along TP and DP with its pipeline depth kept: every rank of the big job takes the
captured stack of the rank that plays its role in the small one (the faulty rank itself, a TP peer
of it, the same stage of the faulty replica, the same stage of a healthy replica), with its own pid
written in, so that texts differ as they do in production. A metric case is grown by giving each
new node the real series of one of the captured healthy nodes and the faulty node its real series,
all on the captured time axis (in synchronous training every node sees the same slow steps, so a
series must not be shifted against the others). Labels follow: the faulty rank keeps its coordinates, and its node is
the truth.
"""

from __future__ import annotations

import random
import re

from stalwart.diagnosis.corpus import CorpusCase, Fault, Truth
from stalwart.diagnosis.models import Coords, EvidenceBundle, NodeMetrics, RankStack, Topology

_PID = re.compile(r"^Process (\d+):", re.MULTILINE)


def _with_pid(text: str, pid: int) -> str:
    """py-spy names the process and its main thread by pid; give the copy its own."""
    m = _PID.search(text)
    if m is None:
        return text
    old = m.group(1)
    return text.replace(f"Process {old}:", f"Process {pid}:", 1).replace(f"Thread {old} ", f"Thread {pid} ")


def _plain(text: str) -> str:
    """The dump as plain py-spy (no --native) would have printed it: native frames left out."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("    ") or ".py:" in line) + "\n"


def expand_hang(
    case: CorpusCase,
    tp: int,
    dp: int,
    ranks_per_node: int,
    *,
    share_texts: bool = False,
    failed: float = 0.0,
    plain: float = 0.0,
    seed: int = 0,
) -> CorpusCase:
    """The case's hang at TP=tp, DP=dp (PP kept), `ranks_per_node` consecutive ranks per node.
    With `share_texts`, ranks of one role share one text through EvidenceBundle.texts (the compact
    form a client sends); otherwise each rank gets its own text with its own pid. Capture noise, as
    at scale: a `failed` fraction of the other ranks' dumps failed (no text), a `plain` fraction was
    taken without --native."""
    src = case.bundle
    topo = src.topology
    if topo is None or case.fault.rank < 0 or case.fault.more_ranks:
        raise ValueError(f"{case.name}: a hang case needs a topology and one faulty rank")
    if (topo.tp == 1 and tp != 1) or (topo.dp == 1 and dp != 1) or tp < topo.tp or dp < topo.dp:
        raise ValueError(f"{case.name}: cannot grow TP={topo.tp} DP={topo.dp} to TP={tp} DP={dp}")
    texts = {s.rank: src.stack_text(s) for s in src.stacks}
    methods = {s.rank: s.method for s in src.stacks}
    f = topo.coords(case.fault.rank)
    healthy_dp = [d for d in range(topo.dp) if d != f.dp] or [f.dp]
    big = Topology(
        world_size=tp * topo.pp * dp,
        tp=tp,
        pp=topo.pp,
        dp=dp,
        rank_nodes={r: f"node-{r // ranks_per_node}" for r in range(tp * topo.pp * dp)},
    )
    shared: dict[int, int] = {}
    shared_texts: list[str] = []
    stacks: list[RankStack] = []
    rng = random.Random(seed)
    fault_rank = big.rank_of(Coords(tp=f.tp, pp=f.pp, dp=f.dp))
    for rank in range(big.world_size):
        c = big.coords(rank)
        st = f.tp if c.tp == f.tp else (c.tp if c.tp < topo.tp and c.tp != f.tp else (f.tp + 1) % topo.tp)
        sd = f.dp if c.dp == f.dp else healthy_dp[c.dp % len(healthy_dp)]
        src_rank = topo.rank_of(Coords(tp=st, pp=c.pp, dp=sd))
        node = big.rank_nodes[rank]
        if rank != fault_rank and failed and rng.random() < failed:
            stacks.append(RankStack(rank=rank, node=node, text="", method="none"))
            continue
        if plain and rng.random() < plain:
            stacks.append(
                RankStack(
                    rank=rank, node=node, text=_with_pid(_plain(texts[src_rank]), 100_000 + rank), method="py-spy"
                )
            )
            continue
        if share_texts:
            if src_rank not in shared:
                shared[src_rank] = len(shared_texts)
                shared_texts.append(texts[src_rank])
            stacks.append(RankStack(rank=rank, node=node, text_ref=shared[src_rank], method=methods[src_rank]))
        else:
            stacks.append(
                RankStack(
                    rank=rank, node=node, text=_with_pid(texts[src_rank], 100_000 + rank), method=methods[src_rank]
                )
            )
    bundle = EvidenceBundle(
        job=f"{case.name}-x{big.world_size}", generation=0, kind="hang", topology=big, stacks=stacks, texts=shared_texts
    )
    return CorpusCase(
        name=f"{case.name}@{big.world_size}" + (f"-noisy{seed}" if failed or plain else ""),
        description=f"{case.description} (grown to TP={tp} PP={topo.pp} DP={dp}, {ranks_per_node} ranks per node"
        + (f"; {failed:.0%} of dumps failed, {plain:.0%} without --native)" if failed or plain else ")"),
        source=f"generated: stalwart.diagnosis.corpus_gen.expand_hang from {case.name}",
        truth=Truth(
            faulty_nodes=[big.rank_nodes[fault_rank]], failure_class=case.truth.failure_class, blame=case.truth.blame
        ),
        fault=Fault(kind=case.fault.kind, rank=fault_rank, step=case.fault.step, method=case.fault.method),
        bundle=bundle,
    )


def expand_metrics(case: CorpusCase, nodes: int, seed: int = 0) -> CorpusCase:
    """The case's per-node series on `nodes` nodes: healthy ones replay captured healthy series; the
    faulty node (if any) replays the faulty node's series, at a random position."""
    src = case.bundle
    if not src.metrics:
        raise ValueError(f"{case.name} has no metrics")
    rng = random.Random(seed)
    faulty = set(case.truth.faulty_nodes)
    healthy = [m for m in src.metrics if m.node not in faulty]
    bad = [m for m in src.metrics if m.node in faulty]
    where = rng.randrange(nodes) if bad else -1
    out: list[NodeMetrics] = []
    for i in range(nodes):
        model = bad[0] if i == where else healthy[rng.randrange(len(healthy))]
        out.append(NodeMetrics(node=f"node-{i}", series=dict(model.series)))
    bundle = EvidenceBundle(job=f"{case.name}-m{nodes}", generation=0, kind="metrics", topology=None, metrics=out)
    return CorpusCase(
        name=f"{case.name}@{nodes}nodes",
        description=f"{case.description} (metrics grown to {nodes} nodes)",
        source=f"generated: stalwart.diagnosis.corpus_gen.expand_metrics from {case.name}",
        truth=Truth(
            faulty_nodes=[f"node-{where}"] if bad else [],
            failure_class=case.truth.failure_class,
            blame=case.truth.blame,
        ),
        fault=case.fault,
        bundle=bundle,
    )
