"""The controller's only view of machines. Local processes here; Kubernetes pods in operators/."""

from __future__ import annotations

from abc import ABC, abstractmethod

from pydantic import BaseModel


class NodeInfo(BaseModel):
    name: str
    alive: bool
    pid: int | None = None
    machine: str | None = None  # the host (Kubernetes node) it runs on, where the cluster knows it
    # Waiting for a machine the cluster does not have (a Pending pod the scheduler could not place).
    unschedulable: bool = False


class PreflightVerdict(BaseModel):
    node: str
    passed: bool
    reasons: list[str] = []


class Cluster(ABC):
    @abstractmethod
    def start_node(self, name: str, role: str | None = None) -> None:
        """Bring up a node running the agent for this job; it registers itself in etcd. `role`: the
        role it serves (a backend with a template per role uses that role's)."""

    @abstractmethod
    def stop_node(self, name: str) -> None:
        """Take a node away (stop its agent and workers). Idempotent."""

    @abstractmethod
    def list_nodes(self) -> list[NodeInfo]:
        """Nodes this cluster has started for the job and not yet stopped."""

    @abstractmethod
    def rendezvous(self, node: str) -> tuple[str, int]:
        """Address and port for torch.distributed's rendezvous, hosted by rank 0 on `node`."""

    def free_machines(self) -> int | None:
        """Machines a node could start on now, beside those the job's live nodes hold; None: the
        cluster sets no limit it knows of (a replacement will come). 0 is what lets a role with
        minReplicas shrink instead of waiting for a lost node's replacement."""
        return None

    def preflight(self, nodes: list[str], procs_per_node: int) -> list[PreflightVerdict]:
        """Collective (all-to-all, all-reduce, all-gather, bitwise checked) and compute checks across
        `nodes`. A backend that cannot run them says so rather than inventing health."""
        return [
            PreflightVerdict(node=n, passed=True, reasons=["pre-flight not supported by this cluster"]) for n in nodes
        ]

    def cordon(self, node: str, reason: str) -> None:
        """Keep the machine under `node` out of future placements until uncordoned (a Kubernetes
        taint; locally a no-op: a replacement always gets a fresh process)."""

    def uncordon(self, node: str) -> None:
        """Undo `cordon`."""

    def close(self) -> None:
        """Release client resources. Does not stop nodes: they outlive a controller restart."""
