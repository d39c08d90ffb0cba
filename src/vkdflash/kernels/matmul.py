"""Quantized matrix multiply: y[n, rows] = x[n, cols] @ W^T, f32 activations and output.

Every result y[i, r] is bit-identical for any n (shaders/mul_mat.comp explains the order),
so a verify pass over n tokens reproduces n single-token decodes exactly."""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import VkdflashError
from ..runtime.memory import View, as_view, prefers_texel_loads, texel_view
from .elementwise import swiglu
from .weights import Weight


# blocks per group in the wide (16 bytes a load) path: 16 / gcd(block bytes, 16); q6_k has none
WIDE_GROUP = {"f32": 1, "f16": 1, "bf16": 1, "q8_0": 8, "q4_0": 8, "q5_0": 8, "q4_1": 4, "q5_1": 2,
              "q4_k": 1}


@dataclass(frozen=True)
class MatmulConfig:
    workgroup: int  # lanes per workgroup (spec constant 0)
    split: int      # lanes sharing one weight row (power of two <= subgroup size)
    nj: int         # most activation rows per invocation (n = 1 always uses 1)
    xbcast: int     # lanes load different parts of x chunks of `xbcast` slots and shuffle (0: none;
                    # subgroup >= 8 * xbcast, split 1)
    wide: bool = True  # 16-byte weight loads (not q6_k)
    rolled_slots: bool = False  # a rolled loop over the nj slots: slower, compiles fast on LLVM
    rows_matvec: int = 1  # weight rows per lane for n = 1 (wide path, 32-value blocks)
    rows_batch: int = 1   # the same for n > 1
    texel: bool = False   # read W and x as uniform texel buffers where the device can bind them
    islots: int = 1       # most slots whose chains interleave with the decode (no spilled chunk)
    rope_nj: int = 0      # matmul_split turns Q and K as it stores them up to this many slots
    norm_nj: int = 0      # matmul_split and glu apply RMSNorm as they load x up to this many slots
    slot_sizes: tuple = ()  # slot counts besides powers of two (nj_for picks the cheapest)

    @property
    def rows_per_group(self) -> int:
        return self.workgroup // self.split


def config_for(features) -> MatmulConfig:
    """The kernel shape for a device: the one hook to tune per vendor.

    CPU (lavapipe): each lane walks one weight row alone, 8 lanes (one SIMD vector) per
    workgroup, activations loaded once per subgroup and shuffled; no cross-lane reduction
    (barriers and shared memory are slow there). Measured in mul_mat.comp's header.
    GPUs: a subgroup-wide split of each row keeps weight loads coalesced (not yet measured)."""
    sg = max(1, int(features.subgroup_size))
    if features.device_type == "cpu":
        # texel loads made weight reads cheap, so n > 1 pays mostly per activation row: 8 rows
        # a slot and 4 weight rows a lane measured best (16-row SmolLM2 matmuls 4.0x a 1-row
        # pass, against 5.0x with nj 4 and 2 rows). n = 1: 2 rows a lane on 8 lanes; 4 on 16
        # since the vector stores (the 1-row pass 32.5-34.8 -> 27.2-30.3 ms; on 8 lanes the
        # same). n = 2 interleaves its two slots with the decode: its matmuls 5-8% faster at 256
        # and 512 bits, n = 4 alike.
        # 16 lanes load two slots' x chunks at once: the GLU at 16 rows 18% faster alone.
        # 16 slots an invocation: a 16-row pass decodes each weight once (LM head 20.6 -> 17.5
        # ms; the pass 2.9-3.1x -> 2.8x a 1-row pass)
        # RoPE as QKV stores (no rope dispatch): 1 and 2 rows 1.9-2.1 ms less wall time a pass;
        # 3 and 4 the same; at 8 and 16 rows the unrolled per-slot turns cost 1.2 and 4 ms more.
        # RMSNorm as QKV and the GLU load x (no rms_norm dispatch; each workgroup repeats the
        # row's reduction): 1 row 22.9 -> 20.9 ms wall, 2 rows 24.6 -> 23.4; 3 and 4 the same.
        # slot counts between the powers of two, where the drafts of MTP (k 2), DFlash (k 4-5)
        # and ngram (k 8-11) fall (SmolLM2, 512 bits, best of 5): 3 rows 30.5 -> 27.7 ms, 5-6
        # 45 -> 39, 9-12 69-70 -> 57-59, 17 (3 x 6) 132 -> 92. 10 and 14 too measured 52-53 for
        # 9-10 rows and 66-67 for 13-14, but every slot count is a set of kernels to compile.
        xbcast = 2 if sg >= 16 else int(sg >= 8)
        return MatmulConfig(workgroup=sg, split=1, nj=16, xbcast=xbcast, rows_matvec=4 if sg >= 16 else 2,
                            rows_batch=4, texel=prefers_texel_loads(features), islots=2, rope_nj=2,
                            norm_nj=2, slot_sizes=(3, 6, 12))
    split = min(sg, 32)
    return MatmulConfig(workgroup=max(64, split), split=split, nj=8, xbcast=0)


def rows_per_lane(weight: Weight, n: int, cfg: MatmulConfig) -> int:
    """Weight rows per lane; mul_mat.comp uses more than 1 only on this same condition."""
    if not cfg.wide or cfg.rolled_slots or weight.ttype.name not in WIDE_GROUP or weight.ttype.qk > 32:
        return 1
    return cfg.rows_matvec if n == 1 else cfg.rows_batch


SLOT_DECODE = 4  # a slot group's weight decoding, in slots' worth of arithmetic (lavapipe, 512 bits:
                 # a matmul costs about 4 + s per group of s slots)


def nj_for(n: int, cfg: MatmulConfig) -> int:
    """Activation rows per invocation. Results do not depend on it (batch invariance), but
    every group runs all its slots (the unused ones repeat the last row) and decodes the weights
    once: the power of two, or the size in cfg.slot_sizes, with the least of both for n rows."""
    if n == 1:
        return 1
    pow2 = min(cfg.nj, 1 << (n - 1).bit_length())
    sizes = [pow2] + [s for s in cfg.slot_sizes if s <= cfg.nj]
    return min(sizes, key=lambda s: (_groups_cost(n, s), s != pow2))


def _groups_cost(n: int, s: int) -> int:
    """Slots' worth of arithmetic for n rows in groups of s slots (each decodes its weights once)."""
    return -(-n // s) * (SLOT_DECODE + s)


def slot_cost(n: int, cfg: MatmulConfig) -> float:
    """What the kernels' model says an n-row pass costs in 1-row passes, before any is timed: where
    slot groups are sized by cost (CPU devices) each group of s slots costs SLOT_DECODE + s slots'
    worth (SmolLM2 on lavapipe: 1.2 / 1.6 / 2.4 / 4.0 at 2 / 4 / 8 / 16 rows, measured 1.15-1.18 /
    1.57-1.71 / 2.2-2.3 / 3.6-3.7); elsewhere 1 (unmodelled: a GPU's few-row pass is near free)."""
    if n <= 1 or not cfg.slot_sizes:
        return 1.0
    return _groups_cost(n, nj_for(n, cfg)) / _groups_cost(1, 1)


def _check_view(view, nbytes: int, what: str):
    view = as_view(view)
    if view.size < nbytes:
        raise VkdflashError(f"matmul: {what} holds {view.size} bytes, needs {nbytes}")
    return view


def matmul(graph, weight: Weight, x_view, y_view, n: int, config: MatmulConfig | None = None,
           accumulate: bool = False) -> None:
    """Record y[n, weight.rows] = x[n, weight.cols] @ W^T (row-major f32 views) into `graph`;
    with `accumulate`, y += x @ W^T (bit-identical to a separate add of the product)."""
    cfg = config or config_for(graph.ctx.features)
    x, y = _check(weight, x_view, y_view, n)
    segments = ((weight.rows,) * 3, (0,) * 3)
    for piece in weight.pieces:
        # pieces write disjoint rows of y: only the first waits for earlier work
        _dispatch(graph, weight, piece, None, x, y, int(n), cfg, accumulate, rows_per_lane(weight, n, cfg), segments)


def norm_on_load(graph, n: int, x_view, norm_weight, weight: Weight, up: Weight | None = None,
                 config: MatmulConfig | None = None) -> bool:
    """Whether matmul_split (glu with `up`) of n rows can apply RMSNorm with `norm_weight` as it
    loads x (the residual stream): the config's slot limit, texel views of x and the norm weight,
    one subgroup a workgroup loading x a subgroup at a time (the norm's reduction order)."""
    cfg = config or config_for(graph.ctx.features)
    ctx = graph.ctx
    views = (as_view(x_view), as_view(norm_weight))
    return (nj_for(n, cfg) <= cfg.norm_nj and cfg.texel and cfg.xbcast >= 1 and cfg.split == 1
            and not cfg.rolled_slots and cfg.workgroup == ctx.features.subgroup_size and weight.cols % 4 == 0
            and len(weight.pieces) == 1 and (up is None or _glu_fused(weight, up, rows_per_lane(weight, n, cfg)))
            and all(texel_view(ctx, v, "f32x4") for v in views))


def matmul_split(graph, weight: Weight, x_view, outs, n: int, config: MatmulConfig | None = None,
                 rope=None, norm=None) -> bool:
    """Record one matmul whose output rows go to up to 3 matrices: outs = [(rows, view), ...],
    rows summing to weight.rows, the views on one buffer (e.g. a stacked QKV weight filling
    Q, K and V: one dispatch instead of three, the same bits).

    rope: a kernels.rope.StoreRope to turn the first two matrices (Q and K) as they are stored,
    bit-identical to a rope() call after it. Returns whether it did (not every kernel shape can:
    then the caller ropes). norm: (weight, eps) of an RMSNorm to apply to x as it is loaded, as
    rms_norm() would (bit for bit); only where norm_on_load says so."""
    cfg = config or config_for(graph.ctx.features)
    n = int(n)
    _check_norm(graph, n, x_view, norm, weight, None, cfg)
    x, _ = _check(weight, x_view, None, n)
    outs = [(int(rows), as_view(v)) for rows, v in outs]
    if not 1 <= len(outs) <= 3 or sum(rows for rows, _ in outs) != weight.rows:
        raise VkdflashError(f"matmul: {len(outs)} outputs of {[r for r, _ in outs]} rows do not split "
                            f"{weight.name}'s {weight.rows} rows into at most 3 parts")
    buf = outs[0][1].buffer
    for rows, v in outs:
        if v.buffer is not buf or v.offset % 4 or v.size < n * rows * 4:
            raise VkdflashError(f"matmul: an output of {rows} rows must be a 4-byte aligned view of "
                                f"{n * rows * 4} bytes on the first output's buffer")
    lo, hi = min(v.offset for _, v in outs), max(v.offset + v.size for _, v in outs)
    y = View(buf, lo, hi - lo)
    ends = tuple(sum(r for r, _ in outs[:i + 1]) for i in range(len(outs)))
    bases = tuple((v.offset - lo) // 4 for _, v in outs)
    pad = 3 - len(outs)
    segments = (ends + (ends[-1],) * pad, bases + (bases[-1],) * pad)
    rl = rows_per_lane(weight, n, cfg)
    if rope is not None and not (nj_for(n, cfg) <= min(cfg.rope_nj, graph.ctx.features.subgroup_size)
                                 and len(weight.pieces) == 1 and rl % 2 == 0 and rope.head_dim % rl == 0
                                 and _vec_stores(weight.pieces[0], rl, segments)):
        rope = None
    for piece in weight.pieces:
        _dispatch(graph, weight, piece, None, x, y, n, cfg, False, rl, segments, rope, norm)
    return rope is not None


def _glu_fused(gate: Weight, up: Weight, rl: int) -> bool:
    """The GLU's one-dispatch shape: same type and shape, one piece each, even rows a lane."""
    same = (gate.ttype, gate.rows, gate.cols, gate.stride, gate.tile) == (up.ttype, up.rows, up.cols, up.stride, up.tile)
    return same and rl % 2 == 0 and len(gate.pieces) == len(up.pieces) == 1


def _check_norm(graph, n, x_view, norm, weight, up, cfg) -> None:
    if norm is not None and not norm_on_load(graph, n, x_view, norm[0], weight, up, cfg):
        raise VkdflashError(f"matmul: {weight.name} cannot apply RMSNorm as it loads x here (norm_on_load)")


def glu(graph, gate: Weight, up: Weight, x_view, y_view, n: int, up_scratch, config: MatmulConfig | None = None,
        norm=None) -> None:
    """Record y = silu(x @ gate^T) * (x @ up^T), an FFN's input half: one fused dispatch where
    the kernel shape allows (same type and shape, one piece each, an even number of rows a
    lane), else two matmuls (up into `up_scratch`) and swiglu. Same bits either way.
    norm: as matmul_split's (one fused dispatch only)."""
    cfg = config or config_for(graph.ctx.features)
    _check_norm(graph, n, x_view, norm, gate, up, cfg)
    x, y = _check(gate, x_view, y_view, n)
    rl = rows_per_lane(gate, n, cfg)
    if _glu_fused(gate, up, rl):
        _dispatch(graph, gate, gate.pieces[0], up.pieces[0], x, y, int(n), cfg, False, rl, ((gate.rows,) * 3, (0,) * 3),
                  norm=norm)
        return
    matmul(graph, gate, x, y, n, cfg)
    matmul(graph, up, x, up_scratch, n, cfg)
    swiglu(graph, y, up_scratch, y, n * gate.rows)


def _check(weight: Weight, x_view, y_view, n: int):
    n = int(n)
    if n < 1:
        raise VkdflashError(f"matmul: n must be >= 1, got {n}")
    if not weight.pieces:
        raise VkdflashError(f"matmul: {weight.name} was destroyed")
    x = _check_view(x_view, n * weight.cols * 4, f"x ({n}x{weight.cols} f32)")
    y = None if y_view is None else _check_view(y_view, n * weight.rows * 4, f"y ({n}x{weight.rows} f32)")
    if x.offset % 16:
        raise VkdflashError(f"matmul: x view offset {x.offset} is not 16-byte aligned")
    return x, y


def _vec_stores(piece, rows_out: int, segments) -> bool:
    """One vector store per activation row and lane: every group of rows_out outputs is whole and
    4-byte words of one output matrix at a multiple of rows_out."""
    return rows_out in (2, 4) and all(v % rows_out == 0 for v in (piece.rows, piece.first_row, *segments[0],
                                                                    *segments[1]))


def _dispatch(graph, weight: Weight, piece, up_piece, x, y, n: int, cfg: MatmulConfig, accumulate: bool,
              rl: int, segments, rope=None, norm=None) -> None:
    """One mul_mat dispatch over one piece of `weight` (GLU when `up_piece` is given);
    segments: (ends, bases) of the output matrices (mul_mat.comp's push constants)."""
    nj = nj_for(n, cfg)
    groups_y = -(-n // nj)
    if groups_y > 65535:
        raise VkdflashError(f"matmul: n={n} needs more than 65535 workgroups; split the batch")
    wide = int(cfg.wide and weight.ttype.name in WIDE_GROUP)
    # wide path: the blocks after the last whole group of WIDE_GROUP
    tail = weight.cols // max(32, weight.ttype.qk) % WIDE_GROUP[weight.ttype.name] if wide else 0
    ctx = graph.ctx
    # bindings: W, x, y, then U for GLU or positions and angles for rope; texel views where the
    # device can bind them all
    bound = [piece.view, x, y] + ([up_piece.view] if up_piece else []) + ([rope.positions, rope.table] if rope else [])
    texels = ((0, 1, 3) if up_piece else (0, 1)) + ((len(bound),) if norm else ())
    if norm:
        bound.append(as_view(norm[0]))
    floats = (1, len(bound) - 1) if norm else (1,)  # x and the norm weight; W and U are words
    tex = {i: texel_view(ctx, bound[i], "f32x4" if i in floats else "u32x4" if wide else "u32") for i in texels} \
        if cfg.texel else {}
    texel = bool(tex) and all(tex.values())
    if texel:
        bound = [tex.get(i, v) for i, v in enumerate(bound)]
    shader = ("mul_mat" + ("_texel" if texel else "") + ("_glu" if up_piece else "") + ("_rope" if rope else "")
              + ("_norm" if norm else "") + "_" + weight.ttype.name)
    texels = texels if texel else ()
    rows_out = rl // 2 if up_piece else rl
    vec = _vec_stores(piece, rows_out, segments)
    # paired x loads need two slots (with one, lavapipe's code for XBCAST 2 ran 50x slower)
    spec = (cfg.workgroup, cfg.split, nj, wide, min(cfg.xbcast, nj), tail,
            int(cfg.rolled_slots), rl, weight.tile, cfg.islots, int(vec))
    push = struct.pack("<12I", piece.rows, weight.cols, n, piece.first_row, weight.stride, *segments[0], *segments[1],
                       int(accumulate)) + (struct.pack("<2I", rope.head_dim, rope.n_rot // 2) if rope else b"") \
        + (struct.pack("<f", norm[1]) if norm else b"")
    pipe = ctx.pipeline(shader, len(bound), len(push), spec, texels)
    graph.dispatch(pipe, bound, (-(-piece.rows // (cfg.rows_per_group * rows_out)), groups_y), push,
                   barrier=piece is weight.pieces[0], label=f"mul_mat{'_glu' if up_piece else ''}/{weight.ttype.name}")
