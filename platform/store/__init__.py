"""etcd-backed state: keys (one versioned module), records, the client and a local server."""

from stalwart.store.client import LeaseLost, Store, StoreUnavailable

__all__ = ["LeaseLost", "Store", "StoreUnavailable"]
