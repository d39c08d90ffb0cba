"""Row softmax (max-subtracted, with a scale) and row argmax, one workgroup per row.

Sized for vocabulary rows (up to ~152k columns); argmax of the logits runs every decode step."""
from __future__ import annotations

import struct

from . import rows
from ..errors import VkdflashError

FLAG_NONFINITE = 0x80000000  # argmax index bit: the row's largest value is not finite


def _shape(ctx, what, n_rows, n_cols, views, passes):
    rows.check_dims(n_rows=n_rows, n_cols=n_cols)
    vec4 = rows.vec4_ok(n_cols, *views)
    wg = rows.workgroup(ctx)
    iters = passes * -(-n_cols // (4 * wg if vec4 else wg))
    return wg, vec4, rows.groups(ctx, n_rows, iters, what)


def softmax(graph, x, out, n_rows: int, n_cols: int, scale: float = 1.0) -> None:
    """out[r] = softmax(x[r] * scale) over rows of n_cols f32; out may be x.
    A row that is all -inf gives zeros."""
    ctx = graph.ctx
    nbytes = n_rows * n_cols * rows.F32
    x = rows.check_view(ctx, "softmax x", x, nbytes)
    out = rows.check_view(ctx, "softmax out", out, nbytes)
    if not scale == scale:
        raise VkdflashError("softmax scale is NaN")
    wg, vec4, groups = _shape(ctx, "softmax", n_rows, n_cols, (x, out), 3)
    pipe = ctx.pipeline("softmax", 2, 12, (wg, int(vec4)))
    graph.dispatch(pipe, [x, out], (groups,), struct.pack("<IIf", n_rows, n_cols, scale), label="softmax")


def argmax(graph, x, out_u32, n_rows: int, n_cols: int, flag_nonfinite: bool = False) -> None:
    """out_u32[r] = index of the largest x[r, :] (uint32). Ties -> lowest index; NaN beats every
    number (first NaN wins, like numpy.argmax); -0.0 ties +0.0. flag_nonfinite: bit 31 set where
    that largest value is NaN, +inf or -inf (FLAG_NONFINITE)."""
    ctx = graph.ctx
    x = rows.check_view(ctx, "argmax x", x, n_rows * n_cols * rows.F32)
    out_u32 = rows.check_view(ctx, "argmax out", out_u32, n_rows * 4)
    wg, vec4, groups = _shape(ctx, "argmax", n_rows, n_cols, (x,), 1)
    texels = rows.texel_inputs(ctx, x) if vec4 else None
    if texels:
        pipe, views = ctx.pipeline("argmax_sg_texel", 2, 8, (wg, 1, int(flag_nonfinite)), (0,)), [*texels, out_u32]
    else:
        pipe, views = ctx.pipeline("argmax", 2, 8, (wg, int(vec4), int(flag_nonfinite))), [x, out_u32]
    graph.dispatch(pipe, views, (groups,), struct.pack("<II", n_rows, n_cols), label="argmax")
