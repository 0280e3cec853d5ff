"""A job's nodes as etcd holds them: registrations, heartbeats and commands, read in one go."""

from __future__ import annotations

from dataclasses import dataclass, field

from stalwart.store import keys
from stalwart.store.client import Store
from stalwart.store.records import AgentCommand, Heartbeat, NodeRegistration


@dataclass
class NodeRecords:
    registrations: dict[str, NodeRegistration] = field(default_factory=dict)
    heartbeats: dict[str, Heartbeat] = field(default_factory=dict)
    commands: dict[str, AgentCommand] = field(default_factory=dict)


def read_nodes(store: Store, job: str) -> NodeRecords:
    """One prefix read: a node without a registration has lost its lease."""
    out = NodeRecords()
    for key, raw in store.get_prefix_raw(keys.nodes_prefix(job)):
        parsed = keys.parse_node_key(job, key)
        if parsed is None:
            continue
        node, leaf = parsed
        if leaf == "registration":
            out.registrations[node] = NodeRegistration.loads(raw)
        elif leaf == "heartbeat":
            out.heartbeats[node] = Heartbeat.loads(raw)
        elif leaf == "command":
            out.commands[node] = AgentCommand.loads(raw)
    return out
