"""Quantized matmul against gguf-py dequantization times x in float64.

Shapes: rows whose size is a multiple of 16 bytes, and "odd" rows of 3 blocks (18/20/22/24/34
bytes) that Weights pads to a 16-byte stride and that end in a partial group (mul_mat.comp's
tail); n = 1 (its own slot count), 7 (slots partly filled) and 64; a cols=4096 matvec.
"other-path" cases flip the device's choice of texel or storage-buffer loads, so both load
paths are checked on every device."""
from __future__ import annotations

import dataclasses

from . import NMSE_MATMUL, Case, launch, rng, uniform
from ..kernels.matmul import config_for, matmul
from ..kernels.types import WEIGHT_TYPES, get_type
from ..kernels.weights import Weight
from ..ref import quants as ref


def _case(tname: str, rows: int, cols: int, n: int, slow: bool = False, other_path: bool = False) -> Case:
    def run(ctx):
        r = rng("matmul", tname, rows, cols, n)
        raw = ref.random_blocks(r, tname, rows, cols)
        x = uniform(r, n, cols)
        cfg = config_for(ctx.features)
        if other_path:
            cfg = dataclasses.replace(cfg, texel=not cfg.texel)
        got = launch(ctx, n * rows * 4, lambda g, w, xb, out: matmul(g, w, xb, out, n, cfg),
                     Weight(ctx, tname, rows, cols, raw), x)
        return got.reshape(n, rows), ref.matmul(x, ref.dequantize(raw, tname, cols))
    name = f"matmul/{'other-path/' if other_path else ''}{tname}/rows={rows},cols={cols},n={n}"
    return Case(name, run, threshold=NMSE_MATMUL, slow=slow)


def cases():
    out = []
    for tname in WEIGHT_TYPES:
        k = get_type(tname).qk > 32
        narrow = 768 if k else 96  # 3 blocks a row
        out += [_case(tname, 37, narrow, 1), _case(tname, 3, narrow, 7), _case(tname, 45, 512, 7),
                _case(tname, 19, 512, 64), _case(tname, 64, 4096, 1)]
        out.append(_case(tname, 512, 4096, 64, slow=True))
        out.append(_case(tname, 3, narrow, 7, other_path=True))
    return out
