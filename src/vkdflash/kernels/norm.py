"""RMSNorm with weight (ggml_rms_norm + ggml_mul), also the per-head q_norm/k_norm of qwen3/DFlash."""
from __future__ import annotations

import struct

from . import rows
from ..errors import VkdflashError


def rms_norm(graph, x, w, out, n_rows: int, dim: int, eps: float) -> None:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for rows r < n_rows of `dim` f32 values.

    Per-head norm: n_rows = n_tokens * n_heads, dim = head_dim, w of length head_dim.
    `out` may be `x` (in place)."""
    ctx = graph.ctx
    rows.check_dims(n_rows=n_rows, dim=dim)
    if not eps >= 0.0:
        raise VkdflashError(f"rms_norm eps must be >= 0, got {eps!r}")
    nbytes = n_rows * dim * rows.F32
    x = rows.check_view(ctx, "rms_norm x", x, nbytes)
    w = rows.check_view(ctx, "rms_norm weight", w, dim * rows.F32)
    out = rows.check_view(ctx, "rms_norm out", out, nbytes)
    vec4 = rows.vec4_ok(dim, x, w, out)
    wg = rows.workgroup(ctx)
    iters = 2 * -(-dim // (4 * wg if vec4 else wg))  # two passes over the row
    texels = rows.texel_inputs(ctx, x, w) if vec4 else None
    if texels:
        pipe, views = ctx.pipeline("rms_norm_sg_texel", 3, 12, (wg, 1), (0, 1)), [*texels, out]
    else:
        pipe, views = ctx.pipeline("rms_norm", 3, 12, (wg, int(vec4))), [x, w, out]
    graph.dispatch(pipe, views, (rows.groups(ctx, n_rows, iters, "rms_norm"),),
                   struct.pack("<IIf", n_rows, dim, eps), label="rms_norm")
