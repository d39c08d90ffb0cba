"""numpy references for weight blocks: quantize, dequantize, random valid blocks, matmul.

gguf-py's `gguf.quants` is the ground truth for every block format (bit-exact with ggml's
reference dequantizers). It cannot quantize Q4_K/Q6_K, so tests of those types use random
but valid blocks (random bits, finite fp16 scales of a sane size) and dequantize them with
gguf-py, as tinygrad's test_gguf does."""
from __future__ import annotations

import numpy as np

from ..errors import VkdflashError
from ..kernels.blocks import QUANTIZABLE, as_type, dequantize, quantize

__all__ = ["QUANTIZABLE", "dequantize", "matmul", "quantize", "random_blocks"]


# fp16 scale ranges (byte offset in the block, low, high) that keep dequantized values
# about in [-1, 1]: q4_k d*6-bit scale*4-bit q, dmin*6-bit min; q6_k d*int8 scale*(q-32);
# iq4_nl d*codebook value (|T| <= 127)
_RANDOM_SCALES = {"q4_k": [(0, 2e-4, 1e-3), (2, 2e-4, 1e-3)], "q6_k": [(208, 1e-4, 2e-4)],
                  "iq4_nl": [(0, 2e-3, 8e-3)]}


def random_blocks(r: np.random.Generator, ttype, rows: int, cols: int) -> np.ndarray:
    """Valid raw blocks with values about in [-1, 1], uint8 (rows, row_bytes), for any weight type."""
    t = as_type(ttype)
    if t.name in QUANTIZABLE:
        return quantize(r.uniform(-1.0, 1.0, (rows, cols)).astype(np.float32), t)
    if t.name not in _RANDOM_SCALES:
        raise VkdflashError(f"no random block generator for {t.name}")
    nblocks = rows * (t.row_bytes(cols) // t.block_bytes)
    blocks = r.integers(0, 256, (nblocks, t.block_bytes), dtype=np.uint8)
    for off, lo, hi in _RANDOM_SCALES[t.name]:
        blocks[:, off:off + 2] = r.uniform(lo, hi, (nblocks, 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def matmul(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """y = x @ w.T in float64 (x: (n, cols), w: dequantized (rows, cols)) -> float32 (n, rows)."""
    return (np.asarray(x, np.float64) @ np.asarray(w, np.float64).T).astype(np.float32)
