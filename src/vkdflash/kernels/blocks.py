"""Host-side block codecs: rows of floats to and from a GGML type's raw blocks, exactly as GGUF
stores them (gguf-py's `gguf.quants`, bit-exact with ggml's reference code). Used at load time
(small vectors read as f32, f32 matrices quantized on upload) and by the references."""
from __future__ import annotations

import numpy as np
from gguf import quants as gq

from ..errors import VkdflashError
from .types import TensorType, get_type

QUANTIZABLE = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"}


def as_type(t) -> TensorType:
    """A TensorType from itself or its name."""
    return t if isinstance(t, TensorType) else get_type(t)


def quantize(x: np.ndarray, ttype) -> np.ndarray:
    """Rows of float values -> raw blocks, uint8 (rows, row_bytes), exactly as gguf stores them."""
    t = as_type(ttype)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise VkdflashError(f"quantize expects a 2-D array, got shape {x.shape}")
    if t.name not in QUANTIZABLE:
        raise VkdflashError(f"gguf-py cannot quantize {t.name}; use random_blocks for tests")
    t.row_bytes(x.shape[1])  # raises on a bad row length
    out = x if t.name == "f32" else gq.quantize(x, t.gguf)
    return np.ascontiguousarray(out).view(np.uint8).reshape(x.shape[0], -1)


def dequantize(raw: np.ndarray, ttype, cols: int) -> np.ndarray:
    """Raw blocks (any shape, uint8 bytes of whole rows) -> float32 (rows, cols)."""
    t = as_type(ttype)
    row_bytes = t.row_bytes(cols)
    data = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if data.size % row_bytes:
        raise VkdflashError(f"{data.size} bytes is not a whole number of {t.name} rows of {cols} values")
    rows = data.reshape(-1, row_bytes)
    if t.name == "f32":
        return rows.view(np.float32).copy()
    return gq.dequantize(rows, t.gguf).astype(np.float32).reshape(-1, cols)
