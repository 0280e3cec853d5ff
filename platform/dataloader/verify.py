"""Verify shard files completely (every block), e.g. after a copy: `python -m stalwart.dataloader.verify`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from stalwart.dataloader.errors import ShardError
from stalwart.dataloader.shard_format import ShardHeader
from stalwart.dataloader.token_shard import TokenShard


def verify_shards(paths: Sequence[str | Path]) -> list[ShardHeader]:
    """Check header, size, checksum table and every block of each shard; raise ShardError on the first bad one."""
    headers = []
    for path in paths:
        shard = TokenShard(path)
        try:
            shard.verify_all()
            headers.append(shard.header)
        finally:
            shard.close()
    return headers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stalwart.dataloader.verify", description=__doc__)
    parser.add_argument("shards", nargs="+", type=Path)
    args = parser.parse_args(argv)
    bad = 0
    for path in args.shards:
        try:
            (header,) = verify_shards([path])
            print(f"ok  {path}: {header.token_count} tokens, {header.doc_count} documents, {header.dtype}")
        except ShardError as exc:
            bad += 1
            print(f"BAD {exc}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
