"""The agent's probe loop stops whether or not it started: an agent that exits while registering (its
shadow loader could not start) shuts down what it never started, and must exit with its reason, not a
traceback from the shutdown."""

from __future__ import annotations

from stalwart.agents.metrics import MetricsExporter
from stalwart.agents.probe_loop import ProbeLoop


def test_a_probe_loop_that_never_started_stops_quietly() -> None:
    loop = ProbeLoop(MetricsExporter("job-a", "node-0"), interval=60)
    loop.stop()
    loop.stop()
