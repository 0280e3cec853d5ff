"""How many warm standbys a job keeps: the 99th percentile of concurrent node failures.

Each node fails within one replacement window with probability p, independently, so the number of
nodes down at once is Binomial(n, p). Keeping its 99th percentile warm means a failure finds a
standby 99% of the time, at the cost of that many idle machines. ByteRobust's table (2 standbys
for 128-256 nodes, 4 for 1,024) is what p = 0.0012 gives.
"""

from __future__ import annotations

import math

from stalwart.spec.model import StandbySettings, TrainingJobSpec


def binomial_quantile(n: int, p: float, q: float) -> int:
    """Smallest k with P(X <= k) >= q for X ~ Binomial(n, p); exact, in log space (n up to 10^6)."""
    if not 0 <= p <= 1 or not 0 < q < 1 or n < 0:
        raise ValueError(f"bad binomial parameters n={n} p={p} q={q}")
    if n == 0 or p == 0:
        return 0
    if p == 1:
        return n
    log_p, log_q = math.log(p), math.log1p(-p)
    cdf = 0.0
    for k in range(n + 1):
        log_pmf = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q
        cdf += math.exp(log_pmf)
        if cdf >= q - 1e-12:
            return k
    return n


def standby_count(nodes: int, failure_probability: float, percentile: float = 0.99) -> int:
    """Standbys that cover `percentile` of the concurrent failures of `nodes` nodes."""
    return binomial_quantile(nodes, failure_probability, percentile)


def standbys_for(settings: StandbySettings, nodes: int) -> int:
    """The job's standby target: the explicit count, else the binomial size, never below the minimum."""
    if settings.count is not None:
        return settings.count
    return max(settings.minimum, standby_count(nodes, settings.node_failure_probability))


def role_standbys(spec: TrainingJobSpec) -> dict[str, int]:
    """Each role's standby target: its own `standbys`, else the job's settings sized from its replicas
    (for a one-role job, exactly the job's target)."""
    return {
        r.name: r.standbys if r.standbys is not None else standbys_for(spec.standbys, r.replicas) for r in spec.roles
    }
