"""A `Cluster` whose nodes are simulated agents (support.scale.simnodes), for the scale harness.

The controller starts, stops and lists nodes through it exactly as through LocalCluster or the
Kubernetes pods; each call goes to the simulator process that holds (or will hold) the node.
Listings are counted and timed: on Kubernetes each one is a pod LIST against the API server.
"""

from __future__ import annotations

import threading
import time

from stalwart.cluster import Cluster, NodeInfo
from support.scale.hostlink import HostLink, host_for

RENDEZVOUS_PORT = 29500


class SimCluster(Cluster):
    def __init__(self, sockets: list[str]) -> None:
        self.links = [HostLink(path) for path in sockets]
        self._lock = threading.Lock()
        self.listings = 0
        self.listing_seconds = 0.0
        self.listed_nodes = 0

    def _link(self, node: str) -> HostLink:
        return self.links[host_for(node, len(self.links))]

    def start_node(self, name: str, role: str | None = None) -> None:
        self._link(name).call("start", node=name)

    def stop_node(self, name: str) -> None:
        self._link(name).call("stop", node=name)

    def list_nodes(self) -> list[NodeInfo]:
        start = time.perf_counter()
        nodes = [NodeInfo(name=n, alive=alive) for link in self.links for n, alive in link.call("list")["nodes"]]
        with self._lock:
            self.listings += 1
            self.listing_seconds += time.perf_counter() - start
            self.listed_nodes += len(nodes)
        return nodes

    def rendezvous(self, node: str) -> tuple[str, int]:
        return "127.0.0.1", RENDEZVOUS_PORT

    def close(self) -> None:
        for link in self.links:
            link.close()
