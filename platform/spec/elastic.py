"""Elastic data parallelism as pure functions of the spec: the sizes a role may run at, the spec at a
size, and how a rank's share of the global batch is split.

A role with `minReplicas` below `replicas` may run on fewer nodes when no machine can be had for a
lost one. Only data parallelism changes: tensor, context, pipeline and expert sizes are kept, so a
size is valid when its world still splits into whole model replicas (TP x CP x PP divides it) and
EP divides its DP; a node that held a member of a TP or PP group takes that whole group out, which
is the same as rounding down to a valid size. With `data.globalBatchOnResize: Keep`, a size whose DP
does not divide the declared global batch is not valid either.
"""

from __future__ import annotations

from collections.abc import Mapping

from stalwart.spec.model import GlobalBatchOnResize, Role, TrainingJobSpec


def elastic(role: Role) -> bool:
    """The role may shrink below its replicas."""
    return role.min_replicas is not None and role.min_replicas < role.replicas


def global_batch(spec: TrainingJobSpec, role: Role) -> int | None:
    """Samples per step at the role's declared size (its DP x microBatch); None without a data section."""
    return role.data_parallel * spec.data.micro_batch if spec.data is not None else None


def valid_sizes(spec: TrainingJobSpec, role: Role) -> list[int]:
    """Node counts the role may run at, from minReplicas (replicas when not elastic) to replicas."""
    low = role.min_replicas if elastic(role) and role.min_replicas is not None else role.replicas
    keep = spec.data is not None and spec.data.global_batch_on_resize is GlobalBatchOnResize.KEEP
    batch = global_batch(spec, role)
    out = []
    for nodes in range(low, role.replicas + 1):
        world = nodes * role.processes_per_node
        if role.parallelism.problem(world) is not None:
            continue
        if keep and batch is not None and batch % role.parallelism.data_parallel(world):
            continue
        out.append(nodes)
    return out


def shrunk_size(spec: TrainingJobSpec, role: Role, nodes: int) -> int | None:
    """The largest valid size at most `nodes` (the nodes the role can still have), or None: no size
    at or above minReplicas fits (the role cannot shrink that far)."""
    fits = [n for n in valid_sizes(spec, role) if n <= nodes]
    return max(fits) if fits else None


def grown_size(spec: TrainingJobSpec, role: Role, current: int, nodes: int) -> int | None:
    """The largest valid size above `current` and at most `nodes` (what it has and could get), or
    None: no larger size fits yet."""
    fits = [n for n in valid_sizes(spec, role) if current < n <= nodes]
    return max(fits) if fits else None


def resized(spec: TrainingJobSpec, replicas: Mapping[str, int]) -> TrainingJobSpec:
    """The spec with the roles named in `replicas` at those node counts, everything else kept: what
    the workers of a generation at that size run. The spec as declared is returned unchanged when no
    role's size differs."""
    if all(replicas.get(r.name, r.replicas) == r.replicas for r in spec.roles):
        return spec
    roles = []
    for role in spec.roles:
        nodes = replicas.get(role.name, role.replicas)
        problem = role.parallelism.problem(nodes * role.processes_per_node)
        if nodes < 1 or problem:
            raise ValueError(f"role {role.name!r} cannot run on {nodes} nodes: {problem or 'none left'}")
        roles.append(role if nodes == role.replicas else role.model_copy(update={"replicas": nodes}))
    return spec.model_copy(update={"roles": roles})


def rank_batch(spec: TrainingJobSpec, role: Role, data_parallel: int) -> tuple[int, int]:
    """(micro-batch, accumulation): a rank of `role` at data-parallel size `data_parallel` trains each
    step on micro-batch x accumulation samples, in `accumulation` passes. At the declared size, or
    with Scale, that is (microBatch, 1); with Keep below it, the rank's share of the declared global
    batch in the fewest passes of at most microBatch samples that split it evenly."""
    if spec.data is None:
        raise ValueError("the job has no data section: no batch to split")
    micro = spec.data.micro_batch
    if spec.data.global_batch_on_resize is GlobalBatchOnResize.SCALE or data_parallel == role.data_parallel:
        return micro, 1
    batch = role.data_parallel * micro
    if batch % data_parallel:
        raise ValueError(
            f"role {role.name!r}: data parallelism {data_parallel} does not divide the global batch of {batch} "
            "(globalBatchOnResize: Keep)"
        )
    share = batch // data_parallel
    passes = -(-share // micro)
    while share % passes:
        passes += 1
    return share // passes, passes
