"""RoPE (ggml_rope / ggml_rope_ext without YaRN), normal and NEOX pairing, positions from a buffer.

Each pair's frequency is precomputed on the host in float64 as a fraction of a turn in 0.64
fixed point; the shader multiplies it by the integer position exactly (modulo one turn), so the
angle stays accurate to f32 rounding at any position instead of losing pos * 2^-24 radians."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from . import rows
from ..errors import VkdflashError
from ..runtime.memory import texel_views

MODES = ("normal", "neox")


def rope_freqs(head_dim_rot: int, freq_base: float, freq_scale: float = 1.0, freq_factors=None) -> np.ndarray:
    """Angle per position of each rotated pair i < n_rot/2: freq_scale * base^(-2i/n_rot) / ff_i
    (ggml's rope_yarn without YaRN extrapolation)."""
    i = np.arange(head_dim_rot // 2, dtype=np.float64)
    f = freq_scale * np.power(float(freq_base), -2.0 * i / head_dim_rot)
    if freq_factors is not None:
        f = f / np.asarray(freq_factors, np.float64)
    return f


def freq_table(n_rot: int, freq_base: float, freq_scale: float = 1.0, freq_factors=None) -> np.ndarray:
    """uint32 (lo, hi) words per pair: round(frac(freq_i / 2pi) * 2^64)."""
    words = []
    for f in rope_freqs(n_rot, freq_base, freq_scale, freq_factors):
        turns = math.fmod(float(f) / (2.0 * math.pi), 1.0) % 1.0
        v = int(round(math.ldexp(turns, 64))) % (1 << 64)
        words += [v & 0xFFFFFFFF, v >> 32]
    return np.array(words, np.uint32)


def _table(ctx, n_rot, freq_base, freq_scale, freq_factors):
    ff = None if freq_factors is None else np.asarray(freq_factors, np.float32)
    if ff is not None and ff.shape != (n_rot // 2,):
        raise VkdflashError(f"rope freq_factors must have n_rot/2 = {n_rot // 2} values, got shape {ff.shape}")
    if ff is not None and not np.all(ff > 0):
        raise VkdflashError("rope freq_factors must be positive")
    key = ("rope table", n_rot, float(freq_base), float(freq_scale), None if ff is None else ff.tobytes())
    return ctx.kept(key, lambda: ctx.upload(freq_table(n_rot, freq_base, freq_scale, ff)))


@dataclass(frozen=True)
class StoreRope:
    """Normal-mode RoPE for a matmul to apply as it stores Q and K (kernels.matmul.matmul_split)."""
    positions: object  # int32 per activation row
    table: object      # freq_table's words
    head_dim: int
    n_rot: int


def store_rope(graph, positions, n_tokens: int, head_dim: int, freq_base: float, mode: str = "normal",
               n_rot: int | None = None, freq_scale: float = 1.0, freq_factors=None) -> StoreRope | None:
    """What matmul_split needs to turn Q and K the way rope() would, or None where it cannot
    (NEOX pairs lie a half head apart, not in one lane's consecutive outputs)."""
    n_rot = head_dim if n_rot is None else n_rot
    _check_args(mode, head_dim, n_rot, freq_base, freq_scale)
    if mode != "normal":
        return None
    positions = rows.check_view(graph.ctx, "rope positions", positions, n_tokens * 4)
    return StoreRope(positions, _table(graph.ctx, n_rot, freq_base, freq_scale, freq_factors), head_dim, n_rot)


def _check_args(mode, head_dim, n_rot, freq_base, freq_scale) -> None:
    if mode not in MODES:
        raise VkdflashError(f"rope mode must be one of {MODES}, got {mode!r}")
    if head_dim % 2 or n_rot % 2 or n_rot > head_dim:
        raise VkdflashError(f"rope needs even head_dim and n_rot <= head_dim, got {head_dim} and {n_rot}")
    if not (freq_base > 0 and freq_scale > 0):
        raise VkdflashError(f"rope freq_base and freq_scale must be positive, got {freq_base} and {freq_scale}")


def rope(graph, x, positions, out, n_tokens: int, n_heads: int, head_dim: int, freq_base: float,
         mode: str = "normal", n_rot: int | None = None, freq_scale: float = 1.0, freq_factors=None,
         second=None) -> None:
    """Rotate x [n_tokens, n_heads, head_dim] f32 into out (may be x) by int32 positions [n_tokens].

    The positions buffer is read at replay time, so a recorded graph serves every step.
    Positions must be below 2^31 in magnitude; n_rot (default head_dim) must be even.
    second: (x2, out2, n_heads2), another tensor rotated the same way in the same dispatch
    (K with Q), bit-identical to a rope call of its own."""
    ctx = graph.ctx
    n_rot = head_dim if n_rot is None else n_rot
    rows.check_dims(n_tokens=n_tokens, n_heads=n_heads, head_dim=head_dim, n_rot=n_rot)
    _check_args(mode, head_dim, n_rot, freq_base, freq_scale)
    nbytes = n_tokens * n_heads * head_dim * rows.F32
    x = rows.check_view(ctx, "rope x", x, nbytes)
    positions = rows.check_view(ctx, "rope positions", positions, n_tokens * 4)
    out = rows.check_view(ctx, "rope out", out, nbytes)
    x2, out2, n_heads2 = second or (x, out, 0)
    if second:
        rows.check_dims(n_heads2=n_heads2)
        nbytes2 = n_tokens * n_heads2 * head_dim * rows.F32
        x2 = rows.check_view(ctx, "rope x2", x2, nbytes2)
        out2 = rows.check_view(ctx, "rope out2", out2, nbytes2)
    table = _table(ctx, n_rot, freq_base, freq_scale, freq_factors)
    wg = rows.workgroup(ctx)
    views = [x, positions, table, out, x2, out2]
    # texel variant: one lane per (token, 4 pairs), vec4 reads and writes
    texels = texel_views(ctx, (x, x2)) if head_dim % 8 == 0 and n_rot % 8 == 0 \
        and out.offset % 16 == 0 and out2.offset % 16 == 0 else None
    texel = texels is not None
    n_items = n_tokens * (head_dim // (8 if texel else 2))
    chunks = -(-n_items // wg)  # one lane per item, each looping over the heads
    if texel:
        views[0], views[4] = texels
        pipe = ctx.pipeline("rope_texel", 6, 20, (wg, int(mode == "neox")), (0, 4))
    else:
        pipe = ctx.pipeline("rope", 6, 20, (wg, int(mode == "neox")))
    graph.dispatch(pipe, views, (rows.groups(ctx, chunks, n_heads + n_heads2, "rope"),),
                   struct.pack("<5I", n_tokens, n_heads, head_dim // 2, n_rot // 2, n_heads2), label=f"rope_{mode}")
