"""Build token shards from text files: `python -m stalwart.dataloader.build OUT_DIR FILE_OR_DIR...`.

Each document is tokenized with the byte-level tokenizer and followed by its end-of-document token;
documents are concatenated and cut into shards of `shard_tokens` tokens (the loader packs sequences
from that stream, so a document may continue into the next shard).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from stalwart.dataloader.errors import DataError
from stalwart.dataloader.shard_format import DEFAULT_BLOCK_TOKENS, SUFFIX, dtype_for_vocab, write_shard
from stalwart.dataloader.tokenizer import ByteTokenizer

DocPer = Literal["file", "line"]


def _input_files(inputs: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            files += sorted(p for p in item.rglob("*") if p.is_file())
        elif item.is_file():
            files.append(item)
        else:
            raise DataError(f"{item}: no such input file or directory")
    if not files:
        raise DataError("no input files")
    return files


def _documents(files: Sequence[Path], doc_per: DocPer) -> Iterator[str]:
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if doc_per == "file":
            if text:
                yield text
        else:
            yield from (line for line in text.splitlines() if line.strip())


def build_shards(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    prefix: str = "shard",
    shard_tokens: int = 1 << 24,
    doc_per: DocPer = "file",
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    overwrite: bool = False,
) -> list[Path]:
    """Tokenize text files into shards `OUT_DIR/{prefix}-00000.stok`, ...; returns the shard paths."""
    if shard_tokens < 2:
        raise ValueError("shard_tokens must be at least 2")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    existing = sorted(out.glob(f"{prefix}-*{SUFFIX}"))
    if existing and not overwrite:
        raise DataError(f"{out}: already holds {len(existing)} '{prefix}' shards (pass overwrite=True / --overwrite)")
    for old in existing:
        old.unlink()
    tok = ByteTokenizer()
    dtype = dtype_for_vocab(tok.vocab_size)
    written: list[Path] = []
    pending: list[np.ndarray] = []
    pending_tokens = 0

    def flush(final: bool) -> None:
        nonlocal pending, pending_tokens
        while pending_tokens >= shard_tokens or (final and pending_tokens):
            stream = np.concatenate(pending)
            take = min(shard_tokens, stream.size)
            path = out / f"{prefix}-{len(written):05d}{SUFFIX}"
            chunk = stream[:take]
            write_shard(
                path,
                chunk,
                vocab_size=tok.vocab_size,
                eos_id=tok.eos_id,
                doc_count=int(np.count_nonzero(chunk == tok.eos_id)),
                block_tokens=block_tokens,
            )
            written.append(path)
            pending = [stream[take:]] if take < stream.size else []
            pending_tokens = stream.size - take

    for text in _documents(_input_files(inputs), doc_per):
        pending.append(np.append(tok.encode(text), tok.eos_id).astype(dtype))
        pending_tokens += pending[-1].size
        if pending_tokens >= shard_tokens:
            flush(final=False)
    flush(final=True)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stalwart.dataloader.build", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder for the shards")
    parser.add_argument("inputs", nargs="+", type=Path, help="text files, or folders of text files")
    parser.add_argument("--prefix", default="shard", help="shard file name prefix (default: shard)")
    parser.add_argument("--shard-tokens", type=int, default=1 << 24, help="tokens per shard (default: 16Mi)")
    parser.add_argument("--doc-per", choices=["file", "line"], default="file", help="what one document is")
    parser.add_argument("--overwrite", action="store_true", help="replace existing shards with this prefix")
    args = parser.parse_args(argv)
    try:
        paths = build_shards(
            args.inputs,
            args.out_dir,
            prefix=args.prefix,
            shard_tokens=args.shard_tokens,
            doc_per=args.doc_per,
            overwrite=args.overwrite,
        )
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
