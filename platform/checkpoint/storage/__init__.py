"""Storage tiers: local or shared filesystem, S3, host memory with a peer copy."""

from stalwart.checkpoint.storage.base import ObjectWriter, Storage, StorageError
from stalwart.checkpoint.storage.filesystem import FileStorage

__all__ = ["FileStorage", "ObjectWriter", "Storage", "StorageError", "open_storage"]


def open_storage(uri: str) -> Storage:
    """'path', 'file:///path', 's3://bucket/prefix?endpoint=http://host:port', 'mem://host:port/ns?peer=host:port&nodes=h:p,h:p'
    (or `nodes_file=PATH`, the same list in a file: a job of thousands of nodes)."""
    from urllib.parse import parse_qs, urlparse

    if "://" not in uri:
        return FileStorage(uri)
    parsed = urlparse(uri)
    query = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
    if parsed.scheme == "file":
        return FileStorage(parsed.path)
    if parsed.scheme == "s3":
        from stalwart.checkpoint.storage.s3 import S3Storage

        return S3Storage(parsed.netloc, parsed.path, endpoint_url=query.get("endpoint"))
    if parsed.scheme == "mem":
        from stalwart.checkpoint.storage.memory import MemoryStorage

        listed = query.get("nodes", "")
        if "nodes_file" in query:
            from pathlib import Path

            try:
                listed = Path(query["nodes_file"]).read_text()
            except OSError as exc:
                raise ValueError(f"memory checkpoint URI {uri!r}: cannot read its nodes_file: {exc}") from None
        nodes = [n for n in listed.split(",") if n]
        return MemoryStorage(parsed.netloc, query.get("peer"), parsed.path.strip("/"), nodes)
    raise ValueError(f"unsupported checkpoint URI scheme {parsed.scheme!r} in {uri!r} (file, s3 or mem)")
