"""Byte-level tokenizer: a document is BOS followed by its UTF-8 bytes (token ids 0..255)."""

from __future__ import annotations

import numpy as np

BOS = 256  # document separator; bytes are 0..255
VOCAB_SIZE = 257


def encode(text: str) -> np.ndarray:
    """BOS + the UTF-8 bytes of `text`, as int64 token ids."""
    b = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    out = np.empty(len(b) + 1, dtype=np.int64)
    out[0] = BOS
    out[1:] = b
    return out


def decode(tokens) -> str:
    return bytes(int(t) for t in tokens if t < 256).decode("utf-8", errors="replace")
