"""Quantized matmul against gguf-py dequantization times x in float64.

Shapes: rows whose size is a multiple of 16 bytes, and "odd" rows of 3 blocks (18/20/22/24/34
bytes) that Weights pads to a 16-byte stride and that end in a partial group (mul_mat.comp's
tail); n = 1 (its own slot count), 7 (slots partly filled) and 64; a cols=4096 matvec.
"other-path" cases flip the device's choice of texel or storage-buffer loads, so both load
paths are checked on every device; "accumulate" cases add the product into y (the residual
add wo and down do in place); "glu" cases are an FFN's silu(x gate^T) * (x up^T) ("texel/" and
"storage/": the fused kernel on that load path); "rope" cases a stacked QKV matmul that turns Q
and K (normal RoPE) as it stores them; "norm" cases QKV and the GLU applying an RMSNorm as they
load x (with a CPU device's kernel shape where the device can run it, else the rms_norm dispatch
and matmul the engine takes there). Outputs written side by side (Q, K, V) each get a guard
region, and so do the buffers a case's kernels write on the way."""
from __future__ import annotations

import dataclasses

import numpy as np

from . import NMSE_MATMUL, Case, Output, launch, rng, uniform
from ..kernels.copy import copy
from ..errors import VkdflashError
from ..kernels.matmul import config_for, glu, matmul, matmul_split, norm_on_load
from ..kernels.norm import rms_norm
from ..kernels.rope import rope, store_rope
from ..kernels.types import WEIGHT_TYPES, get_type
from ..kernels.weights import Weight
from ..ref import ops, quants as ref


def _case(tname: str, rows: int, cols: int, n: int, slow: bool = False, other_path: bool = False,
          accumulate: bool = False) -> Case:
    def run(ctx):
        r = rng("matmul", tname, rows, cols, n, *(("acc",) if accumulate else ()))
        raw = ref.random_blocks(r, tname, rows, cols)
        x = uniform(r, n, cols)
        y0 = uniform(r, n, rows) if accumulate else np.zeros((n, rows), np.float32)
        cfg = config_for(ctx.features)
        if other_path:
            cfg = dataclasses.replace(cfg, texel=not cfg.texel)

        def record(g, w, xb, y0b, out):
            if accumulate:
                copy(g, y0b, out, y0.nbytes)
            matmul(g, w, xb, out, n, cfg, accumulate=accumulate)
        got = launch(ctx, n * rows * 4, record, Weight(ctx, tname, rows, cols, raw), x, y0)
        return got.reshape(n, rows), y0 + ref.matmul(x, ref.dequantize(raw, tname, cols))
    kind = "other-path/" if other_path else "accumulate/" if accumulate else ""
    name = f"matmul/{kind}{tname}/rows={rows},cols={cols},n={n}"
    return Case(name, run, threshold=NMSE_MATMUL, slow=slow)


def _forced(ctx, texel: bool, **kw):
    """The device's config with 4 weight rows a lane (the GLU and store-time RoPE need an even
    number: a shape any device can run) and the given load path."""
    return dataclasses.replace(config_for(ctx.features), rows_matvec=4, rows_batch=4, texel=texel, **kw)


def _glu_case(tname: str, rows: int, cols: int, n: int, texel: bool | None = None) -> Case:
    """texel None: the device's own config (one fused dispatch or three kernels); else the fused
    kernel on that load path."""
    def run(ctx):
        r = rng("matmul-glu", tname, rows, cols, n)
        raws = [ref.random_blocks(r, tname, rows, cols) for _ in "gu"]
        x = uniform(r, n, cols)
        gate, up = (Weight(ctx, tname, rows, cols, raw) for raw in raws)
        scratch = Output(ctx, n * rows * 4)
        cfg = None if texel is None else _forced(ctx, texel)
        try:
            got = launch(ctx, n * rows * 4, lambda gr, xb, out: glu(gr, gate, up, xb, out, n, scratch.views[0], cfg),
                         x, scratch=(scratch,))
        finally:
            for b in (gate, up, scratch):
                b.destroy()
        hg, hu = (ref.matmul(x, ref.dequantize(raw, tname, cols)).astype(np.float64) for raw in raws)
        return got.reshape(n, rows), (hg / (1.0 + np.exp(-hg)) * hu).astype(np.float32)
    path = "" if texel is None else "texel/" if texel else "storage/"
    return Case(f"matmul/glu/{path}{tname}/rows={rows},cols={cols},n={n}", run, threshold=NMSE_MATMUL)


def _rope_case(tname: str, n: int, head_dim: int = 64, heads=(3, 1, 1), n_rot=None, other_path: bool = False) -> Case:
    def run(ctx):
        r = rng("matmul-rope", tname, n, head_dim, heads, n_rot)
        rows = [h * head_dim for h in heads]
        cols = 128
        raw = ref.random_blocks(r, tname, sum(rows), cols)
        x = uniform(r, n, cols)
        pos = r.integers(0, 1 << 20, n).astype(np.int32)
        # a shape that turns as it stores on any device (CPU devices fuse n <= 2 by default)
        cfg = _forced(ctx, config_for(ctx.features).texel != other_path, rope_nj=n)
        w = Weight(ctx, tname, sum(rows), cols, raw)

        def record(g, xb, pb, *views):  # Q, K and V, each with its guard
            if not matmul_split(g, w, xb, list(zip(rows, views)), n, cfg, rope=store_rope(g, pb, n, head_dim, 1e4,
                                                                                          n_rot=n_rot)):
                raise VkdflashError("the QKV matmul did not turn Q and K")
        try:
            got = launch(ctx, tuple(4 * n * k for k in rows), record, x, pos)
        finally:
            w.destroy()
        y = ref.matmul(x, ref.dequantize(raw, tname, cols))
        parts = np.split(y, np.cumsum(rows)[:-1], axis=1)
        turned = [ops.rope(p.reshape(n, -1, head_dim), pos, 1e4, "normal", n_rot).reshape(n, -1) for p in parts[:2]]
        return got, np.concatenate([t.reshape(-1) for t in turned] + [parts[2].reshape(-1)])
    return Case(f"matmul/rope/{'other-path/' if other_path else ''}{tname}/n={n},hd={head_dim}"
                f"{f',n_rot={n_rot}' if n_rot else ''}", run,
                threshold=NMSE_MATMUL)


def _norm_case(tname: str, n: int, ffn: bool, mode: str = "normal") -> Case:
    """mode "neox": QKV that cannot turn Q and K as it stores them (the norm alone)."""
    def run(ctx):
        r = rng("matmul-norm", tname, n, ffn, mode)
        cols, hd, rows = max(128, get_type(tname).qk), 32, ((96, 96) if ffn else (64, 32, 32))
        shapes = rows if ffn else (sum(rows),)  # gate and up, or the stacked QKV
        raws = [ref.random_blocks(r, tname, k, cols) for k in shapes]
        x = (uniform(r, n, cols) * 4).astype(np.float32)  # the residual stream, larger than unit scale
        nw = r.uniform(0.5, 1.5, cols).astype(np.float32)  # norm weights near 1, as trained ones are
        pos = r.integers(0, 4096, n).astype(np.int32)
        sg = ctx.features.subgroup_size
        cfg = _forced(ctx, True, workgroup=sg, split=1, xbcast=2 if sg >= 16 else 1, rolled_slots=False, norm_nj=n,
                      rope_nj=n)
        ws = [Weight(ctx, tname, k, cols, raw) for k, raw in zip(shapes, raws)]
        # where the norm cannot be fused: the rms_norm dispatch's output, and the GLU's up product
        normed, scratch = Output(ctx, n * cols * 4), Output(ctx, n * rows[0] * 4)

        def record(g, xb, nwb, pb, *out):  # the GLU's output, or Q, K and V, each with its guard
            fused = sg >= 8 and norm_on_load(g, n, xb, nwb, ws[0], ws[1] if ffn else None, cfg)
            src = xb
            if not fused:
                src = normed.views[0]
                rms_norm(g, xb, nwb, src, n, cols, 1e-5)
            norm = (nwb, 1e-5) if fused else None
            if ffn:
                glu(g, ws[0], ws[1], src, out[0], n, scratch.views[0], cfg, norm=norm)
                return
            if not matmul_split(g, ws[0], src, list(zip(rows, out)), n, cfg, norm=norm,
                                rope=store_rope(g, pb, n, hd, 1e4, mode)):
                rope(g, out[0], pb, out[0], n, rows[0] // hd, hd, 1e4, mode, second=(out[1], out[1], rows[1] // hd))
        try:
            got = launch(ctx, (4 * n * rows[0],) if ffn else tuple(4 * n * k for k in rows), record, x, nw, pos,
                         scratch=(normed, scratch))
        finally:
            for b in (*ws, normed, scratch):
                b.destroy()
        h = ops.rms_norm(x, nw, 1e-5)
        ys = [ref.matmul(h, ref.dequantize(raw, tname, cols)).astype(np.float64) for raw in raws]
        if ffn:
            return got, (ys[0] / (1.0 + np.exp(-ys[0])) * ys[1]).astype(np.float32).reshape(-1)
        parts = np.split(ys[0].astype(np.float32), np.cumsum(rows)[:-1], axis=1)
        turned = [ops.rope(p.reshape(n, -1, hd), pos, 1e4, mode).reshape(-1) for p in parts[:2]]
        return got, np.concatenate(turned + [parts[2].reshape(-1)])
    kind = "glu" if ffn else "qkv-rope" if mode == "normal" else "qkv"
    return Case(f"matmul/norm/{kind}/{tname}/n={n}", run, threshold=NMSE_MATMUL)


def cases():
    out = []
    for tname in WEIGHT_TYPES:
        k = get_type(tname).qk > 32
        narrow = 768 if k else 96  # 3 blocks a row
        # n 3, 5 (GLU), 7 and 10 meet CPU devices' 3-, 6-, 8- and 12-slot kernels (GPUs: 4 and 8)
        out += [_case(tname, 37, narrow, 1), _case(tname, 3, narrow, 7), _case(tname, 45, 512, 10),
                _case(tname, 19, 512, 64), _case(tname, 64, 4096, 1)]
        out.append(_case(tname, 512, 4096, 64, slow=True))
        out.append(_case(tname, 3, narrow, 7, other_path=True))
        out.append(_case(tname, 12, narrow, 3, accumulate=True))
    out.append(_case("q4_1", 36, 512, 1, accumulate=True))
    # gate/up/swiglu in one dispatch (types with 32-value blocks; others fall back to 3 kernels),
    # the device's config and then each load path; QKV turning Q and K as it stores them, each
    # load path; RMSNorm on load in QKV (any type), in QKV turning Q and K, and in the GLU
    fused = [t for t in WEIGHT_TYPES if get_type(t).qk <= 32]
    out += [_glu_case(t, 20, 256, (5, 3)[i % 2]) for i, t in enumerate(fused)]  # n 5 and 3 in turn
    out.append(_glu_case("q4_1", 36, 512, 1))
    out += [_glu_case(t, 20, 256, 1 + i % 2, texel) for i, t in enumerate(fused) for texel in (True, False)]
    out += [_rope_case(t, 2 - i % 2, other_path=p) for i, t in enumerate(fused) for p in (False, True)]
    out.append(_rope_case("f16", 1, 32, (2, 2, 1), n_rot=16))
    out += [_norm_case(t, 1 + i % 2, False, "neox") for i, t in enumerate(WEIGHT_TYPES)]
    out += [_norm_case(t, 2 - i % 2, ffn) for i, t in enumerate(fused) for ffn in (False, True)]
    return out
