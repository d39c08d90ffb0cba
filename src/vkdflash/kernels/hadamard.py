"""Fast Walsh-Hadamard transform over n-value chunks of f32 rows (hadamard.comp).

The KV-cache rotation (docs/design.md section 2) un-rotates the attention output with it (n_v =
64); K, V and Q are rotated inside the store and attention kernels by the same transform
(shaders/hadamard.glsl). `ref/hadamard.py` says which sizes a cache uses. The result is
bit-identical to `ref.hadamard.fwht_f32` and independent of n_rows."""
from __future__ import annotations

import struct

import numpy as np

from ..errors import VkdflashError
from ..runtime.memory import as_view
from .types import get_type

WORKGROUP = 8
SIZES = (64, 128, 256, 512, 1024)
V_BLOCK = 64  # n_v: V and the attention output always rotate in 64-value chunks


def scale(n: int) -> np.float32:
    """f32(1/sqrt(n)): the one multiply after the butterflies."""
    return np.float32(1.0 / np.sqrt(n))


def fwht(graph, src_view, dst_view, n_rows: int, row_len: int, n: int, workgroup: int = WORKGROUP) -> None:
    """Record dst = H_n x per n-value chunk for n_rows contiguous rows of row_len floats.
    dst may be src (in place)."""
    if n not in SIZES:
        raise VkdflashError(f"Hadamard size {n} is not supported; use one of {', '.join(map(str, SIZES))}")
    if n_rows <= 0 or row_len <= 0 or row_len % n:
        raise VkdflashError(f"fwht needs rows that split into {n}-value chunks, got {n_rows} rows of {row_len}")
    src, dst = as_view(src_view), as_view(dst_view)
    nbytes = 4 * n_rows * row_len
    for name, v in (("source", src), ("destination", dst)):
        if v.size < nbytes:
            raise VkdflashError(f"fwht {name} of {v.size} bytes holds fewer than {n_rows} rows of {row_len} floats")
    if nbytes > graph.ctx.features.max_storage_buffer_range:
        raise VkdflashError(f"fwht of {nbytes} bytes exceeds one binding; split the rows")
    chunks = n_rows * row_len // n
    pipe = graph.ctx.pipeline("hadamard", 2, 4, (workgroup, n, float(scale(n))))
    graph.dispatch(pipe, [src, dst], (-(-chunks // workgroup),), struct.pack("<I", chunks),
                   label=f"fwht.{n}")


# -- which caches rotate, in which chunks (docs/design.md section 2) ------------------

def k_block(head_dim: int) -> int:
    """n_k: the largest power of two >= 64 dividing head_dim (128 for 128, 64 for 64 or 192)."""
    if head_dim % 64:
        raise VkdflashError(f"head_dim {head_dim} is not a multiple of 64: no K rotation")
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def v_block(head_dim: int) -> int:
    """n_v: always 64."""
    if head_dim % V_BLOCK:
        raise VkdflashError(f"head_dim {head_dim} is not a multiple of 64: no V rotation")
    return V_BLOCK


def rotation_enabled(cache_type: str, head_dim: int) -> bool:
    """Rotate a cache (K and V decided separately) iff its type is quantized and head_dim % 64 == 0."""
    return get_type(cache_type).quantized and head_dim % 64 == 0


def rotation_block(cache_type: str, head_dim: int, kind: str) -> int:
    """Chunk size of the rotation for a K or V cache of this type, 0 when it is not rotated."""
    if kind not in ("k", "v"):
        raise VkdflashError(f"rotation kind must be 'k' or 'v', got {kind!r}")
    if not rotation_enabled(cache_type, head_dim):
        return 0
    return k_block(head_dim) if kind == "k" else v_block(head_dim)
