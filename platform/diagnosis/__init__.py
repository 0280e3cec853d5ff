"""Diagnosis: localize the faulty machine from stacks, metrics and logs (engine + HTTP service).

from stalwart.diagnosis import EvidenceBundle, diagnose
verdict = diagnose(bundle)
"""

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
