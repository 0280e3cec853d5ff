"""etcd-backed state: keys (one versioned module), records, the client and a local server.

The client's names load lazily: a training process imports `stalwart.store.records` (through the
worker SDK) and must not pay for, or carry, the etcd client and grpc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stalwart.lazy_exports import lazy_exports

_EXPORTS = {
    "EtcdAuth": "etcd_auth",
    "LeaseLost": "client",
    "Store": "client",
    "StoreAccessDenied": "client",
    "StoreUnavailable": "client",
}
__all__ = ["EtcdAuth", "LeaseLost", "Store", "StoreAccessDenied", "StoreUnavailable"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

if TYPE_CHECKING:
    from stalwart.store.client import LeaseLost, Store, StoreAccessDenied, StoreUnavailable
    from stalwart.store.etcd_auth import EtcdAuth
