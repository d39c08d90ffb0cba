"""Embedding gather against gguf-py dequantization, bit for bit.

Exact is possible: the shader dequantizes with ggml's formulas in the same operation order,
and `precise` in dequant.glsl keeps devices from fusing d*q+m into an fma."""
from __future__ import annotations

import numpy as np

from . import Case, launch, rng
from ..kernels.embed import get_rows
from ..kernels.types import WEIGHT_TYPES, get_type
from ..kernels.weights import Weight
from ..ref import quants as ref


def _case(tname: str, rows: int, cols: int, n: int) -> Case:
    def run(ctx):
        r = rng("get_rows", tname, rows, cols, n)
        raw = ref.random_blocks(r, tname, rows, cols)
        ids = r.integers(0, rows, n).astype(np.uint32)
        ids[-1] = rows - 1  # the last row, where a piece or buffer ends
        got = launch(ctx, n * cols * 4, lambda g, w, ib, out: get_rows(g, w, ib, out, n),
                     Weight(ctx, tname, rows, cols, raw), ids)
        return got.reshape(n, cols), ref.dequantize(raw, tname, cols)[ids]
    return Case(f"get_rows/{tname}/rows={rows},cols={cols},n={n}", run, metric="exact")


def cases():
    out = []
    for tname in WEIGHT_TYPES:
        k = get_type(tname).qk > 32
        out += [_case(tname, 33, 768 if k else 96, 1), _case(tname, 100, 4096, 7)]
    return out
