"""Reading the labeled fault corpus (tests/data/diagnosis/corpus) into evidence bundles.

A case file holds the evidence of one real run with a fault injected and the truth about it (the
faulty machines, the failure class, who is to blame). Stack texts live once in stacks.json.gz,
their process id replaced by a marker, and are restored verbatim on load.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from stalwart.diagnosis.models import EvidenceBundle, NodeMetrics, RankLog, RankStack, Topology

PID_MARK = "<<pid>>"


class Truth(BaseModel):
    model_config = ConfigDict(extra="forbid")

    faulty_nodes: list[str]
    failure_class: str
    blame: str


class Fault(BaseModel):
    """What was injected, and where (rank -1: every rank, or none)."""

    model_config = ConfigDict(extra="forbid")

    kind: str = "none"
    rank: int = -1
    more_ranks: list[int] = []
    step: int = 0
    method: str = "py-spy"
    throttle: float = 0.0


class CorpusCase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    source: str
    truth: Truth
    fault: Fault = Fault()
    bundle: EvidenceBundle


@lru_cache(maxsize=4)
def _texts(path: str) -> dict[str, str]:
    p = Path(path)
    return json.loads(gzip.decompress(p.read_bytes())) if p.exists() else {}


def _stack(row: dict[str, Any], texts: dict[str, str]) -> RankStack:
    text = texts[row["text_ref"]].replace(PID_MARK, str(row.get("pid", 0)))
    return RankStack(rank=row["rank"], node=row["node"], text=text, method=row.get("method", "py-spy"))


def case_from_doc(doc: dict[str, Any], texts: dict[str, str]) -> CorpusCase:
    bundle = EvidenceBundle(
        job=doc["name"],
        generation=0,
        kind=doc.get("kind", "auto"),
        topology=Topology.model_validate(doc["topology"]),
        stacks=[_stack(r, texts) for r in doc.get("stacks", [])],
        rounds=[[_stack(r, texts) for r in rnd] for rnd in doc.get("rounds", [])],
        metrics=[NodeMetrics.model_validate(m) for m in doc.get("metrics", [])],
        logs=[RankLog.model_validate(x) for x in doc.get("logs", [])],
    )
    return CorpusCase(
        name=doc["name"],
        description=doc["description"],
        source=doc["source"],
        truth=Truth.model_validate(doc["truth"]),
        fault=Fault.model_validate(doc.get("fault", {})),
        bundle=bundle,
    )


def load_corpus(root: Path | str) -> list[CorpusCase]:
    """Every case under root/cases, sorted by name."""
    root = Path(root)
    texts = _texts(str(root / "stacks.json.gz"))
    return [case_from_doc(json.loads(p.read_text()), texts) for p in sorted((root / "cases").glob("*.json"))]
