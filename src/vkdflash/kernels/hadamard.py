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

WORKGROUP = 8
SIZES = (64, 128, 256, 512, 1024)


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
