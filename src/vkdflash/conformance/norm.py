"""RMSNorm (whole rows and per-head) against the float64 reference."""
from __future__ import annotations

from . import Case, launch, rng, uniform
from ..kernels.norm import rms_norm
from ..ref import ops


def _case(n_rows: int, dim: int, eps: float, tag: str = ""):
    def run(ctx):
        r = rng("rms_norm", n_rows, dim, eps)
        x, w = uniform(r, n_rows, dim), uniform(r, dim)
        got = launch(ctx, x.nbytes, lambda g, xb, wb, out: rms_norm(g, xb, wb, out, n_rows, dim, eps), x, w)
        return got.reshape(n_rows, dim), ops.rms_norm(x, w, eps)
    return Case(f"rms_norm/f32/{tag}rows={n_rows},dim={dim},eps={eps:g}", run)


def cases():
    return [
        _case(1, 576, 1e-5),
        _case(7, 4096, 1e-6),
        _case(64, 64, 1e-6),
        _case(3, 1001, 1e-5),        # dim not a multiple of 4: scalar path
        _case(13 * 16, 128, 1e-6, "per-head,"),  # q_norm: 13 tokens x 16 heads, head_dim 128
        _case(64 * 8, 128, 1e-6, "per-head,"),
    ]
