"""Diagnosis: localize the faulty machine from stacks, metrics and logs (engine + HTTP service).

from stalwart.diagnosis import EvidenceBundle, diagnose
verdict = diagnose(bundle)

The names load on first use: a node agent reads a stack dump's state with stack_parse and
stack_state alone (stalwart.agents.stacks), without the engine and its numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stalwart.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from stalwart.diagnosis.engine import diagnose
    from stalwart.diagnosis.models import (
        EvidenceBundle,
        NodeMetrics,
        RankLog,
        RankStack,
        StackGroup,
        Suspect,
        SuspectGroup,
        Topology,
        Verdict,
    )

__all__ = [
    "EvidenceBundle",
    "NodeMetrics",
    "RankLog",
    "RankStack",
    "StackGroup",
    "Suspect",
    "SuspectGroup",
    "Topology",
    "Verdict",
    "diagnose",
]
_EXPORTS = {name: "models" for name in __all__ if name != "diagnose"} | {"diagnose": "engine"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
