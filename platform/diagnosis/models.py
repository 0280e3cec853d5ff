"""What crosses the diagnosis service's boundary: the evidence bundle in, the verdict out.

Every list and string has a size limit, so a bundle that validates is one the engine can handle
in bounded time and memory; the HTTP layer adds a limit on the body itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

if TYPE_CHECKING:
    from stalwart.spec.topology import Topology as JobTopology

# The largest job diagnosed: 16,384 nodes x 8 ranks (issue 23 holds 10,000 x 8 = 80,000).
MAX_RANKS = 131_072
MAX_NODES = 65_536
MAX_STACK_CHARS = 256 * 1024  # the agent truncates a dump at 64 KiB; room for other capture tools
MAX_TEXTS = 16_384
MAX_ROUNDS = 32
MAX_SERIES = 4_096
MAX_METRICS = 64
MAX_LOG_LINES = 500
MAX_LINE_CHARS = 4_096
NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$"
JOB_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
DIMENSIONS = ("tp", "cp", "dp", "pp")

NodeName = str
GroupKind = Literal["tp", "cp", "ep", "pp", "dp", "mp", "node", "rank"]
Blame = Literal["node", "group", "job", "user_code", "none"]
Kind = Literal["hang", "slowdown", "crash", "metrics", "auto"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Coords(NamedTuple):
    """A rank's place in the parallel layout."""

    tp: int
    pp: int
    dp: int
    cp: int = 0


class Topology(_Model):
    """The job's parallel layout and where its ranks run.

    `order` lists the dimensions fastest-varying first. Megatron-core's default, "tp-cp-ep-dp-pp",
    is "tp-dp-pp" when CP is 1 (EP subdivides DP, so it is not a dimension of its own here):
    rank = tp_rank + TP * (dp_rank + DP * pp_rank). When cp > 1 and `order` does not name it, CP
    sits right after TP, as in Megatron. Expert-parallel groups (ep > 1) are runs of `ep`
    consecutive DP ranks with the same TP, CP and PP coordinates.
    """

    world_size: int = Field(ge=1, le=MAX_RANKS)
    tp: int = Field(default=1, ge=1, le=MAX_RANKS)
    pp: int = Field(default=1, ge=1, le=MAX_RANKS)
    dp: int = Field(default=1, ge=1, le=MAX_RANKS)
    cp: int = Field(default=1, ge=1, le=MAX_RANKS)
    ep: int = Field(default=1, ge=1, le=MAX_RANKS)
    order: str = Field(default="tp-dp-pp", max_length=32)
    rank_nodes: dict[int, NodeName] = Field(default_factory=dict, max_length=MAX_RANKS)

    @model_validator(mode="before")
    @classmethod
    def _infer_dp(cls, data: object) -> object:
        """A layout given as a world size alone (plain DDP) is all data parallel."""
        if isinstance(data, dict) and "dp" not in data and "world_size" in data:
            other = 1
            for k in ("tp", "pp", "cp"):
                v = data.get(k, 1)
                other *= v if isinstance(v, int) and v > 0 else 1
            ws = data["world_size"]
            if isinstance(ws, int) and other > 0 and ws % other == 0:
                data = {**data, "dp": ws // other}
        return data

    @field_validator("rank_nodes")
    @classmethod
    def _node_names(cls, value: dict[int, str]) -> dict[int, str]:
        import re

        pat = re.compile(NODE_PATTERN)
        for rank, node in value.items():
            if not pat.match(node):
                raise ValueError(f"rank {rank}: node name {node[:80]!r} is not a valid node name")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        if self.tp * self.cp * self.pp * self.dp != self.world_size:
            raise ValueError(
                f"tp*cp*pp*dp = {self.tp}*{self.cp}*{self.pp}*{self.dp} does not equal world_size {self.world_size}"
            )
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide dp ({self.dp})")
        dims = self.dims()  # raises on a bad order
        del dims
        bad = [r for r in self.rank_nodes if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"rank_nodes names ranks outside 0..{self.world_size - 1}: {sorted(bad)[:5]}")
        return self

    def dims(self) -> list[tuple[str, int]]:
        """(dimension, size) pairs, fastest-varying first."""
        names = [d.strip() for d in self.order.split("-") if d.strip()]
        if "cp" not in names:
            names.insert(names.index("tp") + 1 if "tp" in names else 0, "cp")
        if sorted(names) != sorted(DIMENSIONS):
            raise ValueError(f"order {self.order!r} must name each of tp, dp, pp once (and cp at most once)")
        sizes = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}
        return [(n, sizes[n]) for n in names]

    def coords(self, rank: int) -> Coords:
        """The rank's (tp, pp, dp, cp) coordinates."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")
        out: dict[str, int] = {}
        rest = rank
        for name, size in self.dims():
            out[name] = rest % size
            rest //= size
        return Coords(tp=out["tp"], pp=out["pp"], dp=out["dp"], cp=out["cp"])

    def rank_of(self, coords: Coords) -> int:
        rank, stride = 0, 1
        values = coords._asdict()
        for name, size in self.dims():
            rank += values[name] * stride
            stride *= size
        return rank

    def node_of(self, rank: int) -> NodeName:
        return self.rank_nodes.get(rank, f"rank-{rank}")

    @classmethod
    def of(cls, job: JobTopology) -> Topology:
        """The engine's view of the job's layout (stalwart.spec.topology), placement included. The
        engine reads one layout, so a job of several roles is seen as one data-parallel world: its
        suspects are then grouped by node and rank, never by a parallel group that spans roles."""
        world = job.world_size
        if len(job.roles) == 1:
            r = job.roles[0]
            return cls(world_size=world, tp=r.tp, cp=r.cp, pp=r.pp, dp=r.dp, ep=r.ep, rank_nodes=dict(job.rank_nodes))
        return cls(world_size=world, dp=world, rank_nodes=dict(job.rank_nodes))


class RankStack(_Model):
    """One rank's stack dump, as the agent captured it (stalwart.agents.stacks.StackDump)."""

    rank: int = Field(ge=0, lt=MAX_RANKS)
    node: NodeName = Field(default="", max_length=253)
    text: str = Field(default="", max_length=MAX_STACK_CHARS)
    method: str = Field(default="py-spy", max_length=32)
    text_ref: int | None = Field(
        default=None, ge=0, lt=MAX_TEXTS, description="index into EvidenceBundle.texts, instead of `text`"
    )


def rank_stacks(reports: list[Any]) -> list[RankStack]:
    """Each rank's dump from the agents' StackReports (stalwart.store.records), as diagnosis reads them."""
    return [
        RankStack(rank=int(d["rank"]), node=r.node, text=d.get("text") or "", method=str(d.get("method") or "none"))
        for r in reports
        for d in r.stacks
        if d.get("rank") is not None
    ]


class NodeMetrics(_Model):
    """One node's metric series, oldest first, one value per heartbeat or scrape (None: not measured);
    with `rank`, the series of one rank on that node (its phase times), compared with other ranks."""

    node: NodeName = Field(min_length=1, max_length=253)
    rank: int | None = Field(default=None, ge=0, lt=MAX_RANKS)
    series: dict[str, list[float | None]] = Field(default_factory=dict, max_length=MAX_METRICS)

    @field_validator("series")
    @classmethod
    def _bounded(cls, value: dict[str, list[float | None]]) -> dict[str, list[float | None]]:
        for name, xs in value.items():
            if len(name) > 64:
                raise ValueError(f"metric name {name[:70]!r}... is longer than 64 characters")
            if len(xs) > MAX_SERIES:
                raise ValueError(f"series {name!r} has {len(xs)} values, more than {MAX_SERIES}")
        return value


class RankLog(_Model):
    """An exited (or still running) rank: its exit code and the tail of its output."""

    rank: int = Field(ge=0, lt=MAX_RANKS)
    node: NodeName = Field(default="", max_length=253)
    exit_code: int | None = None
    lines: list[str] = Field(default_factory=list, max_length=MAX_LOG_LINES)
    kernel_log: list[str] = Field(
        default_factory=list,
        max_length=MAX_LOG_LINES,
        description="the node's kernel log (dmesg) from around the failure",
    )

    @field_validator("lines", "kernel_log")
    @classmethod
    def _short_lines(cls, value: list[str]) -> list[str]:
        return [line[:MAX_LINE_CHARS] for line in value]


class EvidenceBundle(_Model):
    """Everything the controller gathered about one failure of one job generation."""

    job: str = Field(pattern=JOB_PATTERN)
    generation: int = Field(default=0, ge=0)
    kind: Kind = "auto"
    topology: Topology | None = None
    stacks: list[RankStack] = Field(default_factory=list, max_length=MAX_RANKS)
    metrics: list[NodeMetrics] = Field(default_factory=list, max_length=MAX_NODES)
    logs: list[RankLog] = Field(default_factory=list, max_length=MAX_RANKS)
    rounds: list[list[RankStack]] = Field(default_factory=list, max_length=MAX_ROUNDS)
    texts: list[str] = Field(
        default_factory=list,
        max_length=MAX_TEXTS,
        description="stack texts shared by ranks, referenced by RankStack.text_ref",
    )

    @field_validator("texts")
    @classmethod
    def _short_texts(cls, value: list[str]) -> list[str]:
        for i, t in enumerate(value):
            if len(t) > MAX_STACK_CHARS:
                raise ValueError(f"texts[{i}] is {len(t)} characters, more than {MAX_STACK_CHARS}")
        return value

    @model_validator(mode="after")
    def _refs(self) -> EvidenceBundle:
        n = len(self.texts)
        world = self.topology.world_size if self.topology is not None else None
        for where, stacks in [("stacks", self.stacks), *((f"rounds[{i}]", r) for i, r in enumerate(self.rounds))]:
            for s in stacks:
                if s.text_ref is not None and s.text_ref >= n:
                    raise ValueError(f"{where}: rank {s.rank} refers to texts[{s.text_ref}], but there are {n} texts")
                if world is not None and s.rank >= world:
                    raise ValueError(f"{where}: rank {s.rank} is outside the topology's world of {world}")
        if world is not None:
            for log in self.logs:
                if log.rank >= world:
                    raise ValueError(f"logs: rank {log.rank} is outside the topology's world of {world}")
        return self

    def stack_text(self, stack: RankStack) -> str:
        return self.texts[stack.text_ref] if stack.text_ref is not None else stack.text


class Suspect(_Model):
    node: NodeName
    score: float = Field(ge=0.0, le=1.0)
    reasons: list[str] = Field(default_factory=list, max_length=32)
    ranks: list[int] = Field(default_factory=list, max_length=MAX_RANKS)


class StackGroup(_Model):
    """Ranks whose stacks have the same signature. `frames` are the normalized frames of the
    thread that matters (the main thread), innermost first, as py-spy and faulthandler print them."""

    signature: str = Field(max_length=64)
    frames: list[str] = Field(max_length=256)
    ranks: list[int] = Field(max_length=MAX_RANKS)
    count: int
    outlier: bool
    state: str = "unknown"  # active | collective | p2p-recv | p2p-send | unknown


class SuspectGroup(_Model):
    """The smallest parallel group that explains the outliers (kind 'mp': one model replica, TP x PP)."""

    kind: GroupKind
    index: int
    ranks: list[int] = Field(max_length=MAX_RANKS)
    nodes: list[NodeName] = Field(max_length=MAX_NODES)


class MetricScore(_Model):
    metric: str
    node: NodeName
    rank: int | None = None  # the rank on `node` that is out, when ranks were compared
    score: float  # robust z-score in the bad direction, mean over the windows it persisted
    windows: int = 0  # windows it was an outlier in, in runs of the persistence or more in a row


Action = Literal["evict", "rollback", "fail", "restart", "stop_time_checks", "observe", "none"]


class Verdict(_Model):
    job: str
    generation: int
    failure_class: str
    blame: Blame
    suspects: list[Suspect] = Field(default_factory=list)
    flagged: list[NodeName] = Field(default_factory=list, description="nodes to evict: suspects scored >= 0.5")
    group: SuspectGroup | None = None
    stack_groups: list[StackGroup] = Field(default_factory=list)
    metric_ranking: list[MetricScore] = Field(default_factory=list)
    confidence: float = Field(ge=0.0, le=1.0)
    action: Action = "none"
    summary: str
    runbook: str
    evidence: list[str] = Field(default_factory=list)
