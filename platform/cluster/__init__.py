"""The Cluster interface and its local-process implementation."""

from stalwart.cluster.base import Cluster, NodeInfo, PreflightVerdict
from stalwart.cluster.local import LocalCluster

__all__ = ["Cluster", "LocalCluster", "NodeInfo", "PreflightVerdict"]
