"""The controller's only view of machines. Local processes here; Kubernetes pods in operators/."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pydantic import BaseModel


class NodeInfo(BaseModel):
    name: str
    alive: bool
    pid: int | None = None


class Cluster(ABC):
    @abstractmethod
    def start_node(self, name: str) -> None:
        """Bring up a node running the agent for this job; it registers itself in etcd."""

    @abstractmethod
    def stop_node(self, name: str) -> None:
        """Take a node away (stop its agent and workers). Idempotent."""

    @abstractmethod
    def list_nodes(self) -> list[NodeInfo]:
        """Nodes this cluster has started for the job and not yet stopped."""

    @abstractmethod
    def rendezvous(self, node: str) -> tuple[str, int]:
        """Address and port for torch.distributed's rendezvous, hosted by rank 0 on `node`."""

    def close(self) -> None:
        """Release client resources. Does not stop nodes: they outlive a controller restart."""
