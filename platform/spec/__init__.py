"""The TrainingJob spec model and its YAML loader."""

from stalwart.spec.loader import SpecError, load_job, parse_job
from stalwart.spec.model import (
    API_VERSION,
    KIND,
    CheckpointSettings,
    DataSettings,
    DataSource,
    FaultTolerance,
    RestartScope,
    Role,
    TrainingJob,
    TrainingJobSpec,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "CheckpointSettings",
    "DataSettings",
    "DataSource",
    "FaultTolerance",
    "RestartScope",
    "Role",
    "SpecError",
    "TrainingJob",
    "TrainingJobSpec",
    "load_job",
    "parse_job",
]
