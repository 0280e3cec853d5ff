"""A byte-level tokenizer: nothing to download, every text encodes, and ids are stable forever."""

from __future__ import annotations

import numpy as np


class ByteTokenizer:
    """Ids 0..255 are the UTF-8 bytes; 256 ends a document, so packing keeps document boundaries."""

    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        data = bytes(int(i) for i in np.asarray(ids).ravel() if int(i) < 256)
        return data.decode("utf-8", errors="replace")
