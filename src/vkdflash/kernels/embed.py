"""Embedding lookup: out[i, :] = W[ids[i], :] dequantized to f32, for every weight type.

The ids live in a uint32 buffer the host rewrites between replays of a recorded graph. An id
outside [0, rows) yields a row of NaN (loud, never stale memory)."""
from __future__ import annotations

import struct

from ..errors import VkdflashError
from ..runtime.memory import as_view
from .weights import Weight

WORKGROUP = 8  # one SIMD vector on lavapipe; each lane dequantizes one 32-value chunk


def get_rows(graph, weight: Weight, ids_view, out_view, n: int) -> None:
    """Record out[n, weight.cols] (f32) = rows ids[0..n) (uint32) of `weight` into `graph`."""
    n = int(n)
    if n < 1 or n > 65535:
        raise VkdflashError(f"get_rows: n must be in 1..65535, got {n}")
    if not weight.pieces:
        raise VkdflashError(f"get_rows: {weight.name} was destroyed")
    ids, out = as_view(ids_view), as_view(out_view)
    if ids.size < 4 * n:
        raise VkdflashError(f"get_rows: ids view holds {ids.size} bytes, needs {4 * n} ({n} uint32)")
    if out.size < 4 * n * weight.cols:
        raise VkdflashError(f"get_rows: out view holds {out.size} bytes, needs {4 * n * weight.cols} "
                            f"({n}x{weight.cols} f32)")
    pipe = graph.ctx.pipeline("get_rows", 3, 20, (WORKGROUP, weight.ttype.id, weight.tile))
    groups = -(-(weight.cols // 32) // WORKGROUP)
    for i, piece in enumerate(weight.pieces):
        push = struct.pack("<5I", piece.first_row, piece.rows, weight.rows, weight.cols, weight.stride)
        # pieces write disjoint output rows: only the first waits for earlier work
        graph.dispatch(pipe, [piece.view, ids, out], (groups, n), push, barrier=i == 0,
                       label=f"get_rows/{weight.ttype.name}")
