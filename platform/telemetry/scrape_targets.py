"""Where a Prometheus finds a local job's exporters: a file_sd_configs file, kept current.

`stalwart run` writes `<workdir>/prometheus-targets.json` and rewrites it when nodes come and go,
so a Prometheus on the same machine scrapes every agent, the job-metrics exporter and the diagnosis
service with one scrape config (Prometheus re-reads the file on change):

    scrape_configs:
      - job_name: stalwart
        file_sd_configs: [{files: [".stalwart/runs/*/prometheus-targets.json"]}]

Each target group carries a `component` label (agent, job-metrics, diagnosis). On Kubernetes the
chart's PodMonitor/ServiceMonitor do this instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel

from stalwart.store.nodes import NodeRecords

FILE_NAME = "prometheus-targets.json"


class TargetGroup(BaseModel):
    targets: list[str]
    labels: dict[str, str]


def target_groups(nodes: NodeRecords, services: dict[str, str]) -> list[TargetGroup]:
    """The agents with a metrics port, then each service (name -> host:port)."""
    agents = sorted(
        f"{reg.address}:{reg.metrics_port}" for reg in nodes.registrations.values() if reg.metrics_port is not None
    )
    groups = [TargetGroup(targets=agents, labels={"component": "agent"})] if agents else []
    groups += [TargetGroup(targets=[addr], labels={"component": name}) for name, addr in sorted(services.items())]
    return groups


def write_targets(path: Path, groups: list[TargetGroup]) -> bool:
    """Replace the file atomically (Prometheus may read it at any moment); True if it changed."""
    text = json.dumps([g.model_dump() for g in groups], indent=2) + "\n"
    try:
        if path.read_text() == text:
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True
