"""The Cluster interface and its local-process implementation.

The names load on first use: the agent zygote reads its request's model from here and must not
import the etcd client (its fork server's workers carry no gRPC)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from stalwart.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from stalwart.cluster.base import Cluster, NodeInfo, PreflightVerdict
    from stalwart.cluster.local import LocalCluster

__all__ = ["Cluster", "LocalCluster", "NodeInfo", "PreflightVerdict"]
_EXPORTS = {"Cluster": "base", "NodeInfo": "base", "PreflightVerdict": "base", "LocalCluster": "local"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
