"""etcd-backed state: keys (one versioned module), records, the client and a local server."""

from stalwart.store.client import LeaseLost, Store, StoreAccessDenied, StoreUnavailable
from stalwart.store.etcd_auth import EtcdAuth

__all__ = ["EtcdAuth", "LeaseLost", "Store", "StoreAccessDenied", "StoreUnavailable"]
