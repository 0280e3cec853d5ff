"""A source over Hugging Face data files (parquet, jsonl, arrow), tokenized once into `.stok` shards.

Why tokenize ahead: random access by position must stay O(1), and a position names a window of tokens,
which is only known once every earlier document is tokenized. So the first open (or `stalwart data
index`) reads each file with `datasets`, tokenizes its text field with the user's `tokenizers` JSON, and
writes one checksummed `.stok` shard per file into an index folder; afterwards a source is exactly a
token-shard source (same packing, per-block CRC on first read, O(1) reads), and neither `datasets` nor
`tokenizers` is imported again. The index records each data file's size and xxh3: at every open the files
are hashed again (one streaming pass, whatever the position) and a file that differs is refused, by name.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from stalwart.dataloader.checksums import build_lock, file_digest, read_json_checked, write_json_atomic
from stalwart.dataloader.config import HF_KINDS, SourceSpec
from stalwart.dataloader.errors import DataError, ShardError
from stalwart.dataloader.shard_format import write_shard
from stalwart.dataloader.sources import TokenSource

INDEX_FILE = "index.json"
_BATCH = 1024


def index_folder(spec: SourceSpec, paths: Sequence[Path]) -> Path:
    """Where this source's index lives: keyed by the files' paths, the tokenizer, the field and the EOS."""
    assert spec.tokenizer is not None
    tok = Path(spec.tokenizer)
    if not tok.is_file():
        raise DataError(f"source {spec.name!r}: tokenizer file {spec.tokenizer!r} does not exist")
    parts = [str(p.resolve()) for p in paths] + [file_digest(tok), spec.text_field, spec.eos_token or ""]
    key = xxhash.xxh3_64_hexdigest("\0".join(parts).encode())
    root = Path(spec.index_dir) if spec.index_dir else paths[0].parent / ".stalwart-index"
    return root / f"{spec.name}-{key}"


def _load(path: Path, cache: Path) -> Any:
    import datasets  # type: ignore[import-untyped]

    datasets.disable_progress_bars()
    kind = HF_KINDS[path.suffix]
    if kind == "arrow":
        return datasets.Dataset.from_file(str(path))
    return datasets.load_dataset(kind, data_files=[str(path)], split="train", cache_dir=str(cache))


def _tokenize_file(path: Path, spec: SourceSpec, folder: Path, out: Path) -> dict[str, Any]:
    from tokenizers import Tokenizer

    assert spec.tokenizer is not None
    tokenizer = Tokenizer.from_file(spec.tokenizer)
    eos = -1
    if spec.eos_token is not None:
        found = tokenizer.token_to_id(spec.eos_token)
        if found is None:
            raise DataError(f"source {spec.name!r}: eos_token {spec.eos_token!r} is not in the tokenizer's vocabulary")
        eos = int(found)
    cache = Path(tempfile.mkdtemp(prefix="hf-cache-", dir=folder))
    try:
        try:
            ds = _load(path, cache)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{path}: source {spec.name!r} cannot be read as {HF_KINDS[path.suffix]}: {exc}") from None
        if spec.text_field not in ds.column_names:
            raise DataError(
                f"{path}: source {spec.name!r} has text_field {spec.text_field!r}, the file's columns are "
                f"{ds.column_names}"
            )
        pieces: list[np.ndarray] = []
        docs = 0
        for batch in ds.select_columns([spec.text_field]).iter(batch_size=_BATCH):
            texts = [t if isinstance(t, str) else "" for t in batch[spec.text_field]]
            for enc in tokenizer.encode_batch(texts, add_special_tokens=False):
                pieces.append(np.asarray(enc.ids + ([eos] if eos >= 0 else []), dtype=np.int64))
            docs += len(texts)
        del ds
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    header = write_shard(out, tokens, vocab_size=tokenizer.get_vocab_size(), eos_id=eos, doc_count=docs)
    return {"shard": out.name, "tokens": header.token_count, "documents": docs}


def build_index(spec: SourceSpec, paths: Sequence[Path], *, rebuild: bool = False) -> Path:
    """Tokenize the files into shards once (under a lock); return the index folder."""
    folder = index_folder(spec, paths)
    with build_lock(folder / INDEX_FILE):
        if rebuild or not (folder / INDEX_FILE).exists():
            (folder / INDEX_FILE).unlink(missing_ok=True)  # a rebuild that fails leaves no index to trust
            files = []
            for i, path in enumerate(paths):
                if not path.is_file():
                    raise DataError(f"source {spec.name!r}: data file {str(path)!r} does not exist")
                digest = file_digest(path)
                entry = _tokenize_file(path, spec, folder, folder / f"shard-{i:05d}.stok")
                files.append({"path": str(path.resolve()), "size": path.stat().st_size, "xxh3": digest, **entry})
            write_json_atomic(folder / INDEX_FILE, {"source": spec.name, "files": files})
    return folder


def open_hf_source(spec: SourceSpec, paths: Sequence[Path], seq_len: int) -> TokenSource:
    """The source's token shards, after checking that every data file is the one the index was built from."""
    folder = build_index(spec, paths)
    index = read_json_checked(folder / INDEX_FILE)
    for path, entry in zip(paths, index["files"], strict=True):
        size = path.stat().st_size if path.is_file() else -1
        if size != entry["size"] or file_digest(path) != entry["xxh3"]:
            raise ShardError(
                path,
                f"corrupted or changed since its index was built (size/xxh3 differ from {folder / INDEX_FILE}); "
                "refusing to serve it. If the change is intended: stalwart data index --rebuild",
            )
    return TokenSource(spec.name, [folder / e["shard"] for e in index["files"]], seq_len)
