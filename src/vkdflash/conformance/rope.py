"""RoPE against the float64 reference: both pairings, two frequency bases, partial rotation,
per-pair frequency factors, and positions far beyond where a plain f32 angle stays accurate."""
from __future__ import annotations

import numpy as np

from . import Case, launch, rng, uniform
from ..kernels.rope import rope
from ..ref import ops


def _case(n_tokens, n_heads, head_dim, mode, freq_base, max_pos=8192, n_rot=None, factors=False):
    def run(ctx):
        r = rng("rope", n_tokens, n_heads, head_dim, mode, freq_base, max_pos, n_rot, factors)
        x = uniform(r, n_tokens, n_heads, head_dim)
        pos = r.integers(0, max_pos + 1, n_tokens).astype(np.int32)
        pos[-1] = max_pos
        rot = head_dim if n_rot is None else n_rot
        ff = r.uniform(1.0, 8.0, rot // 2).astype(np.float32) if factors else None
        got = launch(ctx, x.nbytes, lambda g, xb, pb, out: rope(g, xb, pb, out, n_tokens, n_heads, head_dim,
                                                                 freq_base, mode, n_rot, freq_factors=ff), x, pos)
        return got.reshape(x.shape), ops.rope(x, pos, freq_base, mode, n_rot, freq_factors=ff)
    extra = (f",n_rot={n_rot}" if n_rot else "") + (",freq_factors" if factors else "")
    return Case(f"rope/{mode}/f32/tokens={n_tokens},heads={n_heads},hd={head_dim},base={freq_base:g},"
                f"pos<={max_pos}{extra}", run)


def cases():
    out = []
    for mode in ("normal", "neox"):
        out += [
            _case(1, 9, 64, mode, 10000.0),
            _case(64, 8, 128, mode, 1e6),
            _case(17, 4, 128, mode, 10000.0, max_pos=1 << 20),
            _case(5, 2, 256, mode, 1e6, n_rot=64),
            _case(7, 3, 36, mode, 10000.0),  # head_dim no multiple of 8: the storage-buffer kernel on any device
        ]
    out.append(_case(9, 3, 128, "neox", 500000.0, factors=True))
    return out
