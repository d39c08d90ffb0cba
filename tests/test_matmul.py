"""mul_mat and get_rows: batch invariance (bitwise), the row-pieces path, and input checks."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vkdflash.errors import VkdflashError
from vkdflash.kernels.embed import get_rows
from vkdflash.kernels.matmul import MatmulConfig, config_for, matmul, matmul_split
from vkdflash.kernels.types import WEIGHT_TYPES, get_type
from vkdflash.kernels.weights import Weight
from vkdflash.ref import quants as ref
from vkdflash.runtime.graph import Graph

NMAX = 64


def _batch_outputs(ctx, w: Weight, x: np.ndarray, config=None) -> tuple[np.ndarray, list[np.ndarray]]:
    """y of each x row alone (n=1), and y of x[:n] for every n = 1..NMAX, all in one replay."""
    rows, cols = w.rows, w.cols
    xb = ctx.upload(x)
    single = ctx.buffer(NMAX * rows * 4)
    batched = [ctx.buffer(n * rows * 4) for n in range(1, NMAX + 1)]
    g = Graph(ctx)
    for i in range(NMAX):
        matmul(g, w, xb.view(i * cols * 4, cols * 4), single.view(i * rows * 4, rows * 4), 1, config)
    for n, yb in enumerate(batched, 1):
        matmul(g, w, xb, yb, n, config)
    g.run()
    got1 = single.read(np.float32).reshape(NMAX, rows)
    got = [yb.read(np.float32).reshape(-1, rows) for yb in batched]
    g.destroy(), xb.destroy(), single.destroy()
    for yb in batched:
        yb.destroy()
    return got1, got


def _assert_invariant(got1, got):
    for n, y in enumerate(got, 1):
        diff = np.flatnonzero((y.view(np.uint32) != got1[:n].view(np.uint32)).any(axis=1))
        assert diff.size == 0, f"n={n}: rows {diff.tolist()} differ bitwise from their n=1 results"


# aligned: rows fill whole 16-byte words; odd: rows the device pads to 16 bytes, ending in a
# partial group of blocks. The odd shape covers one type per group size and q6_k (conformance
# covers every type's odd shapes).
ODD_COLS = {"q4_0": 192, "q4_1": 64, "q5_1": 96, "q6_k": 768}


@pytest.mark.parametrize("tname, shape", [(t, "aligned") for t in WEIGHT_TYPES]
                         + [(t, "odd") for t in ODD_COLS])
def test_batch_invariance(ctx, tname, shape):
    """y[i] is bit-identical for every n = 1..64, and equal to a matvec of row i alone."""
    k = get_type(tname).qk > 32
    cols = (512 if k else 256) if shape == "aligned" else ODD_COLS[tname]
    rows = 12  # 12 rows x 4 bytes: y views of single rows stay 16-byte aligned
    r = np.random.default_rng(7)
    raw = ref.random_blocks(r, tname, rows, cols)
    w = Weight(ctx, tname, rows, cols, raw)
    assert w.stride % 16 == 0 and (shape == "aligned" or w.stride > w.row_bytes)  # odd rows are padded
    x = r.uniform(-1, 1, (NMAX, cols)).astype(np.float32)
    got1, got = _batch_outputs(ctx, w, x)
    w.destroy()
    _assert_invariant(got1, got)
    want = ref.matmul(x, ref.dequantize(raw, tname, cols))
    assert np.sum((got1 - want) ** 2) / np.sum(want ** 2) < 5e-4


# GPU shapes unroll the slot loop; rolled here, as lavapipe's LLVM needs ~40 s per unrolled one.
# Workgroups are whole subgroups (8 or 16 lanes on lavapipe, by its SIMD width).
OTHER_SHAPES = {"split1": lambda sg: MatmulConfig(sg, 1, 8, False, rolled_slots=True),
                "split4": lambda sg: MatmulConfig(max(16, sg), 4, 4, False, rolled_slots=True),
                "split8": lambda sg: MatmulConfig(sg, 8, 8, False, rolled_slots=True),
                "narrow": lambda sg: MatmulConfig(sg, 1, 4, True, wide=False)}


@pytest.mark.parametrize("shape", OTHER_SHAPES)
@pytest.mark.parametrize("tname", ["q5_1", "q4_k", "f16"])
def test_other_shapes_invariant(ctx, shape, tname):
    """Other kernel shapes (lanes splitting a row, no activation shuffle, 4-byte loads) are
    correct and batch-invariant too."""
    config = OTHER_SHAPES[shape](ctx.features.subgroup_size)
    if config.split > ctx.features.subgroup_size or config.workgroup % ctx.features.subgroup_size:
        pytest.skip("shape needs a larger subgroup")
    cols = 256 if tname == "q4_k" else 96  # small unrolled bodies: these shapes compile slowly on lavapipe
    r = np.random.default_rng(8)
    raw = ref.random_blocks(r, tname, 12, cols)
    w = Weight(ctx, tname, 12, cols, raw)
    x = r.uniform(-1, 1, (NMAX, cols)).astype(np.float32)
    got1, got = _batch_outputs(ctx, w, x, config)
    w.destroy()
    _assert_invariant(got1, got)
    want = ref.matmul(x, ref.dequantize(raw, tname, cols))
    assert np.sum((got1 - want) ** 2) / np.sum(want ** 2) < 5e-4


@pytest.mark.parametrize("tname", ["q4_1", "q5_0", "q8_0"])
def test_load_paths_give_same_bits(ctx, tname):
    """The shuffled x loads (lanes sum a chunk's x by XOR shuffles), per-lane x loads, and a
    rolled slot loop give the same bits at n = 1, 3 and 16: every path sums a chunk's x in
    one tree order."""
    sg = ctx.features.subgroup_size
    base = config_for(ctx.features)
    if not base.xbcast:
        pytest.skip("the device's shape loads x per lane already")
    rows, cols = 16, 256
    r = np.random.default_rng(12)
    raw = ref.random_blocks(r, tname, rows, cols)
    w = Weight(ctx, tname, rows, cols, raw)
    x = r.uniform(-1, 1, (16, cols)).astype(np.float32)
    configs = [base, dataclasses.replace(base, xbcast=0), MatmulConfig(sg, 1, 8, 0, rolled_slots=True)]
    xb = ctx.upload(x)
    ys = {(n, k): ctx.buffer(n * rows * 4) for n in (1, 3, 16) for k in range(len(configs))}
    g = Graph(ctx)
    for (n, k), yb in ys.items():
        matmul(g, w, xb, yb, n, configs[k])
    g.run()
    got = {key: yb.read(np.uint32) for key, yb in ys.items()}
    for yb in ys.values():
        yb.destroy()
    g.destroy(), xb.destroy(), w.destroy()
    for n in (1, 3, 16):
        for k in range(1, len(configs)):
            assert np.array_equal(got[n, 0], got[n, k]), f"n={n}: {configs[k]} differs from {base}"


@pytest.mark.parametrize("tname", ["q4_1", "q8_0", "q6_k", "f16"])
def test_row_tiles_are_invisible(ctx, tname):
    """The interleaved layout (kernels/weights.py) changes no bit of mul_mat or get_rows, on the
    wide, narrow (q6_k) and storage paths, with a row count that leaves a partial tile."""
    rows, cols = 37, 256
    r = np.random.default_rng(11)
    raw = ref.random_blocks(r, tname, rows, cols)
    x = r.uniform(-1, 1, (5, cols)).astype(np.float32)
    ids = np.array([0, 36, 9, 17, 8], np.uint32)
    configs = [None, dataclasses.replace(config_for(ctx.features), texel=False)]
    outs = {}
    for tile in (1, 8):
        w = Weight(ctx, tname, rows, cols, raw, tile=tile)
        xb, ib = ctx.upload(x), ctx.upload(ids)
        ys = [ctx.buffer(n * rows * 4) for n in (1, 5) for _ in configs]
        e = ctx.buffer(5 * cols * 4)
        g = Graph(ctx)
        for k, (n, cfg) in enumerate((n, cfg) for n in (1, 5) for cfg in configs):
            matmul(g, w, xb, ys[k], n, cfg)
        get_rows(g, w, ib, e, 5)
        g.run()
        outs[tile] = [y.read(np.uint32) for y in ys] + [e.read(np.uint32)]
        for b in ys + [e, xb, ib]:
            b.destroy()
        g.destroy(), w.destroy()
    for a, b in zip(outs[1], outs[8]):
        assert np.array_equal(a, b)
    deq = ref.dequantize(raw, tname, cols)
    assert np.array_equal(outs[8][-1].view(np.float32).reshape(5, cols), deq[ids])


@pytest.mark.parametrize("tname", ["q4_1", "q8_0"])
def test_split_output_is_three_matmuls(ctx, tname):
    """A stacked QKV weight's one matmul writes each part's rows where that part's own matmul
    would, bit for bit (n = 1 and a batch), and the row slices work alone."""
    rows, cols, n = (64, 16, 16), 128, 5
    r = np.random.default_rng(12)
    raws = [ref.random_blocks(r, tname, k, cols) for k in rows]
    whole = Weight(ctx, tname, sum(rows), cols, np.concatenate([x.reshape(-1) for x in raws]), tile=8)
    parts = [whole.rows_slice(sum(rows[:i]), k, f"part{i}") for i, k in enumerate(rows)]
    assert all(p is not None for p in parts) and whole.rows_slice(4, 8, "x") is None  # off a tile
    x = ctx.upload(r.uniform(-1, 1, (n, cols)).astype(np.float32))
    for m in (1, n):
        out, alone = ctx.buffer(4 * n * sum(rows)), [ctx.buffer(4 * n * k) for k in rows]
        views = [out.view(4 * n * sum(rows[:i]), 4 * n * k) for i, k in enumerate(rows)]
        g = Graph(ctx)
        matmul_split(g, whole, x, list(zip(rows, views)), m)
        for p, a in zip(parts, alone):
            matmul(g, p, x, a, m)
        g.run()
        for i, k in enumerate(rows):
            got = out.read(np.uint32, m * k, 4 * n * sum(rows[:i]))
            assert np.array_equal(got, alone[i].read(np.uint32, m * k))
        for i, p in enumerate(parts):
            assert np.array_equal(p.dequantize(), ref.dequantize(raws[i], tname, cols))
        g.destroy(), out.destroy()
        for a in alone:
            a.destroy()
    with pytest.raises(VkdflashError, match="do not split"):
        matmul_split(Graph(ctx), whole, x, [(64, out_view) for out_view in [ctx.buffer(4096).view()]], 1)
    for p in parts:
        p.destroy()
    whole.destroy(), x.destroy()


@pytest.mark.parametrize("tname, n_rot", [("q4_1", None), ("f16", 8)])
def test_split_with_rope_is_split_then_rope_bitwise(ctx, tname, n_rot):
    """RoPE applied as a QKV matmul stores Q and K gives rope()'s bits, V untouched, at every slot
    count (n = 1 and 2 fuse by default on CPU devices; a config fusing up to 16 slots checks the
    kernel there); where it declines it says so and the caller's rope makes the same bits."""
    from vkdflash.kernels.rope import rope, store_rope
    hd, nq, nk, nv = 16, 4, 2, 2  # head_dim; Q, K, V heads
    rows, cols, nmax = (nq * hd, nk * hd, nv * hd), 64, 16
    r = np.random.default_rng(21)
    w = Weight(ctx, tname, sum(rows), cols, ref.random_blocks(r, tname, sum(rows), cols))
    x = ctx.upload(r.uniform(-1, 1, (nmax, cols)).astype(np.float32))
    pos = ctx.upload(r.integers(-3, 70000, nmax).astype(np.int32))
    cfg = config_for(ctx.features)
    for m, conf in ((1, None), (2, None), (5, None), (16, dataclasses.replace(cfg, rope_nj=16))):
        fused_cfg = conf or cfg
        outs = [ctx.buffer(4 * nmax * sum(rows)) for _ in range(2)]
        views = [[o.view(4 * nmax * sum(rows[:i]), 4 * nmax * k) for i, k in enumerate(rows)] for o in outs]
        g = Graph(ctx)
        turn = store_rope(g, pos, m, hd, 10000.0, n_rot=n_rot)
        fused = matmul_split(g, w, x, list(zip(rows, views[0])), m, fused_cfg, rope=turn)
        if not fused:
            rope(g, views[0][0], pos, views[0][0], m, nq, hd, 10000.0, n_rot=n_rot, second=(views[0][1], views[0][1], nk))
        matmul_split(g, w, x, list(zip(rows, views[1])), m, fused_cfg)
        rope(g, views[1][0], pos, views[1][0], m, nq, hd, 10000.0, n_rot=n_rot, second=(views[1][1], views[1][1], nk))
        g.run()
        assert fused == (m <= min(fused_cfg.rope_nj, ctx.features.subgroup_size) and fused_cfg.rope_nj > 0) or \
            not fused_cfg.rope_nj
        for i, k in enumerate(rows):
            got, want = (o.read(np.uint32, m * k, 4 * nmax * sum(rows[:i])) for o in outs)
            assert np.array_equal(got, want), f"n={m} fused={fused} part {i}"
        g.destroy()
        for o in outs:
            o.destroy()
    assert store_rope(Graph(ctx), pos, 1, hd, 10000.0, "neox") is None  # pairs half a head apart
    w.destroy(), x.destroy(), pos.destroy()


@pytest.mark.parametrize("tname", ["q4_1", "q8_0", "f16"])
def test_norm_on_load_is_rms_norm_then_matmul_bitwise(ctx, tname):
    """QKV (with its RoPE) and the GLU applying RMSNorm as they load x give rms_norm()'s bits
    downstream: at n = 1 and 2 (fused by default on CPU devices) and, with a config fusing up to
    16 slots, at 3 and 16; a pass the config does not fuse is refused, not run wrong."""
    from vkdflash.kernels.matmul import glu, norm_on_load
    from vkdflash.kernels.norm import rms_norm
    from vkdflash.kernels.rope import rope, store_rope
    hd, rows, cols, ff, nmax, eps = 16, (64, 32, 32), 64, 96, 16, 1e-5
    r = np.random.default_rng(22)
    w = Weight(ctx, tname, sum(rows), cols, ref.random_blocks(r, tname, sum(rows), cols))
    gate, up = (Weight(ctx, tname, ff, cols, ref.random_blocks(r, tname, ff, cols)) for _ in "gu")
    x = ctx.upload((r.standard_normal((nmax, cols)) * 3).astype(np.float32))
    nw = ctx.upload(r.uniform(0.5, 1.5, cols).astype(np.float32))
    pos = ctx.upload(np.arange(nmax, dtype=np.int32) + 5)
    cfg = config_for(ctx.features)
    for m, conf in ((1, cfg), (2, cfg), (3, dataclasses.replace(cfg, norm_nj=16)),
                    (16, dataclasses.replace(cfg, norm_nj=16, rope_nj=16))):
        g = Graph(ctx)
        if not norm_on_load(g, m, x, nw, w, config=conf):
            assert not cfg.norm_nj, "a CPU device fuses the norm"
            break
        assert norm_on_load(g, m, x, nw, gate, up, conf)
        bufs = [ctx.buffer(4 * nmax * k) for k in (sum(rows), sum(rows), ff, ff, ff, ff)]
        xn = ctx.buffer(4 * nmax * cols)
        qkv = [[b.view(4 * nmax * sum(rows[:i]), 4 * nmax * k) for i, k in enumerate(rows)] for b in bufs[:2]]
        turn = store_rope(g, pos, m, hd, 1e4)
        roped = matmul_split(g, w, x, list(zip(rows, qkv[0])), m, conf, rope=turn, norm=(nw, eps))
        glu(g, gate, up, x, bufs[2], m, bufs[4], conf, norm=(nw, eps))
        rms_norm(g, x, nw, xn, m, cols, eps)
        matmul_split(g, w, xn, list(zip(rows, qkv[1])), m, conf)
        for parts in (qkv[1],) + (() if roped else (qkv[0],)):
            rope(g, parts[0], pos, parts[0], m, rows[0] // hd, hd, 1e4, second=(parts[1], parts[1], rows[1] // hd))
        glu(g, gate, up, xn, bufs[3], m, bufs[5], conf)
        g.run()
        for i, k in enumerate(rows):
            got, want = (b.read(np.uint32, m * k, 4 * nmax * sum(rows[:i])) for b in bufs[:2])
            assert np.array_equal(got, want), f"n={m} part {i}"
        assert np.array_equal(bufs[2].read(np.uint32, m * ff), bufs[3].read(np.uint32, m * ff)), f"glu n={m}"
        g.destroy()
        for b in bufs + [xn]:
            b.destroy()
    g = Graph(ctx)
    assert not norm_on_load(g, 3, x, nw, w)  # beyond the default config's slots
    with pytest.raises(VkdflashError, match="RMSNorm"):
        matmul_split(g, w, x, [(sum(rows), ctx.buffer(4 * 3 * sum(rows)).view())], 3, norm=(nw, eps))
    for b in (w, gate, up, x, nw, pos):
        b.destroy()


def test_slot_counts_cost_least():
    """nj_for: powers of two, or a listed size where its groups decode and compute less (a group of
    s slots costs about SLOT_DECODE + s); without sizes (GPUs) the powers of two as before."""
    from vkdflash.kernels.matmul import nj_for
    cpu, gpu = MatmulConfig(16, 1, 16, 2, slot_sizes=(3, 6, 12)), MatmulConfig(64, 32, 8, 0)
    assert [nj_for(n, cpu) for n in (1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 16, 17, 24, 32, 33, 64)] == \
        [1, 2, 3, 4, 6, 6, 8, 12, 12, 16, 16, 6, 12, 16, 12, 16]
    assert [nj_for(n, gpu) for n in (1, 2, 3, 5, 9, 64)] == [1, 2, 4, 8, 8, 8]


def test_a_passs_guessed_cost_follows_its_slot_groups():
    """slot_cost: groups x (SLOT_DECODE + s) in 1-row passes where slot sizes are chosen by cost
    (9 rows run one 12-slot group, 17 three of 6); unmodelled devices price every pass as one row."""
    from vkdflash.kernels.matmul import SLOT_DECODE, slot_cost
    cpu, gpu = MatmulConfig(16, 1, 16, 2, slot_sizes=(3, 6, 12)), MatmulConfig(64, 32, 8, 0)
    one = SLOT_DECODE + 1
    assert [slot_cost(n, cpu) for n in (1, 2, 4, 9, 16, 17)] == \
        [1.0, (SLOT_DECODE + 2) / one, (SLOT_DECODE + 4) / one, (SLOT_DECODE + 12) / one, (SLOT_DECODE + 16) / one,
         3 * (SLOT_DECODE + 6) / one]
    assert {slot_cost(n, gpu) for n in (1, 2, 9, 64)} == {1.0}


def test_default_config(ctx):
    cfg = config_for(ctx.features)
    assert cfg.workgroup % cfg.split == 0 and cfg.split <= ctx.features.subgroup_size


def _check_pieces(ctx, w: Weight, raw: np.ndarray, n: int):
    r = np.random.default_rng(9)
    x = r.uniform(-1, 1, (n, w.cols)).astype(np.float32)
    ids = r.integers(0, w.rows, n).astype(np.uint32)
    ids[0], ids[-1] = 0, w.rows - 1
    xb, yb, ib, eb = ctx.upload(x), ctx.buffer(n * w.rows * 4), ctx.upload(ids), ctx.buffer(n * w.cols * 4)
    g = Graph(ctx)
    matmul(g, w, xb, yb, n)
    get_rows(g, w, ib, eb, n)
    g.run()
    y, e = yb.read(np.float32).reshape(n, w.rows), eb.read(np.float32).reshape(n, w.cols)
    g.destroy(), xb.destroy(), yb.destroy(), ib.destroy(), eb.destroy()
    deq = ref.dequantize(raw, w.ttype, w.cols)
    want = ref.matmul(x, deq)
    assert np.sum((y - want) ** 2) / np.sum(want ** 2) < 5e-4
    assert np.array_equal(e.view(np.uint32), deq[ids].view(np.uint32))


@pytest.mark.parametrize("tname", ["q4_0", "q6_k", "f16"])
def test_pieces_small_limit(ctx, tname, monkeypatch):
    """Row pieces, exercised cheaply by pretending the device binds only 4 KiB at once."""
    monkeypatch.setattr(ctx.features, "max_storage_buffer_range", 4096)
    rows, cols = 50, 512
    raw = ref.random_blocks(np.random.default_rng(3), tname, rows, cols)
    w = Weight(ctx, tname, rows, cols, raw)
    assert len(w.pieces) > 3
    assert all(p.view.size <= 4096 for p in w.pieces)
    _check_pieces(ctx, w, raw, 5)
    w.destroy()


@pytest.mark.slow
def test_pieces_beyond_storage_range(ctx):
    """An f32 weight larger than maxStorageBufferRange runs through the pieces path."""
    cols = 4096
    rows = ctx.features.max_storage_buffer_range // (cols * 4) + 64
    raw = np.random.default_rng(4).uniform(-1, 1, (rows, cols)).astype(np.float32)
    w = Weight(ctx, "f32", rows, cols, raw)
    assert w.nbytes > ctx.features.max_storage_buffer_range and len(w.pieces) >= 2
    _check_pieces(ctx, w, raw, 3)
    w.destroy()


def test_bad_inputs(ctx):
    w = Weight.from_float(ctx, np.zeros((8, 64), np.float32), "q8_0")
    x, y = ctx.buffer(4 * 64 * 2), ctx.buffer(4 * 8 * 2)
    g = Graph(ctx)
    with pytest.raises(VkdflashError, match="n must be"):
        matmul(g, w, x, y, 0)
    with pytest.raises(VkdflashError, match="x .* needs"):
        matmul(g, w, x, y, 3)
    with pytest.raises(VkdflashError, match="y .* needs"):
        matmul(g, w, x, y.view(0, 16), 2)
    with pytest.raises(VkdflashError, match="aligned"):
        matmul(g, w, x.view(4, 4 * 64), y, 1)
    with pytest.raises(VkdflashError, match="ids view"):
        get_rows(g, w, ctx.buffer(4), ctx.buffer(4 * 64 * 2), 2)
    with pytest.raises(VkdflashError, match="out view"):
        get_rows(g, w, ctx.buffer(8), ctx.buffer(4 * 64), 2)
    w.destroy()
    with pytest.raises(VkdflashError, match="destroyed"):
        matmul(g, w, x, y, 1)
    assert len(g) == 0
    g.destroy(), x.destroy(), y.destroy()


def test_bad_id_gives_nan(ctx):
    w = Weight.from_float(ctx, np.ones((4, 32), np.float32), "f16")
    ids, out = ctx.upload(np.array([1, 4, 7], np.uint32)), ctx.buffer(3 * 32 * 4)
    g = Graph(ctx)
    get_rows(g, w, ids, out, 3)
    g.run()
    got = out.read(np.float32).reshape(3, 32)
    assert (got[0] == 1).all() and np.isnan(got[1:]).all()
    ids.write(np.array([3, 0, 2], np.uint32))  # ids are rewritable between replays
    g.run()
    assert (out.read(np.float32) == 1).all()
    g.destroy(), w.destroy(), ids.destroy(), out.destroy()


@pytest.mark.parametrize("tname", ["q4_1", "q6_k"])
def test_texel_and_storage_paths_agree_bitwise(ctx, tname, monkeypatch):
    """Texel loads are only a faster read: where the device cannot bind a texel view (here: a
    pretended limit of one texel) matmul takes the storage path and gives the same bits."""
    rows, cols, n = 21, 512, 5
    raw = ref.random_blocks(np.random.default_rng(4), tname, rows, cols)
    w = Weight(ctx, tname, rows, cols, raw)
    x = np.random.default_rng(5).uniform(-1, 1, (n, cols)).astype(np.float32)
    texel = dataclasses.replace(config_for(ctx.features), texel=True)
    outs = []
    for limit in (ctx.features.max_texel_buffer_elements, 1):
        monkeypatch.setattr(ctx.features, "max_texel_buffer_elements", limit)
        xb, yb, g = ctx.upload(x), ctx.buffer(n * rows * 4), Graph(ctx)
        matmul(g, w, xb, yb, n, texel)
        g.run()
        outs.append((yb.read(np.float32), {d.pipeline.shader for d in g._dispatches}))
        g.destroy(), xb.destroy(), yb.destroy()
    w.destroy()
    (fast, fast_shaders), (slow, slow_shaders) = outs
    assert fast_shaders == {f"mul_mat_texel_{tname}"} and slow_shaders == {f"mul_mat_{tname}"}
    assert np.array_equal(fast.view(np.uint32), slow.view(np.uint32))


@pytest.mark.parametrize("n", [1, 6])
def test_accumulate_is_matmul_then_add_bitwise(ctx, n):
    """wo and down add into the residual stream inside matmul: the bits must be those of the
    product followed by the add kernel, or greedy output would change."""
    from vkdflash.kernels.elementwise import add
    rows, cols = 40, 256
    r = np.random.default_rng(6)
    w = Weight(ctx, "q4_1", rows, cols, ref.random_blocks(r, "q4_1", rows, cols))
    x = r.uniform(-1, 1, (n, cols)).astype(np.float32)
    y0 = r.uniform(-1, 1, (n, rows)).astype(np.float32)
    xb, fused, split, prod = ctx.upload(x), ctx.upload(y0), ctx.upload(y0), ctx.buffer(y0.nbytes)
    g = Graph(ctx)
    matmul(g, w, xb, fused, n, accumulate=True)
    matmul(g, w, xb, prod, n)
    add(g, split, prod, split, n * rows)
    g.run()
    got, want = fused.read(np.float32), split.read(np.float32)
    assert not np.array_equal(got, y0.reshape(-1))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    for b in (g, w, xb, fused, split, prod):
        b.destroy()


@pytest.mark.parametrize("accumulate", [False, True])
def test_vector_and_float_stores_agree_bitwise(ctx, accumulate):
    """A lane stores its consecutive output rows as one vector only when every group of them is
    whole (12 rows); 13 rows take the per-float stores, with a partial group at the end. The
    rows both compute must match bitwise, at the 1-row and the batched kernel shapes."""
    cols, n = 256, 16
    r = np.random.default_rng(9)
    raw = ref.random_blocks(r, "q4_1", 13, cols)
    x = r.uniform(-1, 1, (n, cols)).astype(np.float32)
    y0 = r.uniform(-1, 1, (n, 13)).astype(np.float32)
    ws = [Weight(ctx, "q4_1", rows, cols, raw[:rows]) for rows in (12, 13)]
    xb = ctx.upload(x)
    outs = {(rows, m): ctx.upload(np.ascontiguousarray(y0[:m, :rows])) for rows in (12, 13) for m in (1, n)}
    g = Graph(ctx)
    for (rows, m), yb in outs.items():
        matmul(g, ws[rows - 12], xb, yb, m, accumulate=accumulate)
    g.run()
    for m in (1, n):
        vec, flt = (outs[rows, m].read(np.float32).reshape(m, rows) for rows in (12, 13))
        assert np.array_equal(vec.view(np.uint32), flt[:, :12].view(np.uint32)), f"n={m}"
    assert np.array_equal(outs[13, 1].read(np.float32).view(np.uint32), outs[13, n].read(np.float32)[:13].view(np.uint32))
    for b in (g, xb, *ws, *outs.values()):
        b.destroy()


@pytest.mark.parametrize("tname, fused", [("q4_1", True), ("q8_0", True), ("q6_k", False)])
def test_glu_is_two_matmuls_and_swiglu_bitwise(ctx, tname, fused):
    """The fused gate/up/swiglu dispatch gives the bits of the three separate kernels, for the
    1-row and the batched kernel shapes, so the FFN stays batch invariant."""
    from vkdflash.kernels.elementwise import swiglu
    from vkdflash.kernels.matmul import glu
    rows, cols, n = 72, 512, 6
    r = np.random.default_rng(7)
    raws = [ref.random_blocks(r, tname, rows, cols) for _ in "gu"]
    gate, up = (Weight(ctx, tname, rows, cols, raw) for raw in raws)
    x = r.uniform(-2, 2, (n, cols)).astype(np.float32)
    xb, scratch = ctx.upload(x), ctx.buffer(n * rows * 4)
    outs = [ctx.buffer(n * rows * 4) for _ in range(4)]
    g = Graph(ctx)
    glu(g, gate, up, xb, outs[0], n, scratch)
    for i in range(n):  # one row at a time: the n = 1 kernel shape
        row = lambda b, k: b.view(i * k * 4, k * 4)  # noqa: E731
        glu(g, gate, up, row(xb, cols), row(outs[1], rows), 1, row(scratch, rows))
    matmul(g, gate, xb, outs[2], n)
    matmul(g, up, xb, outs[3], n)
    swiglu(g, outs[2], outs[3], outs[2], n * rows)
    shaders = [d.pipeline.shader for d in g._dispatches]
    g.run()
    batched, single, want = (b.read(np.float32).view(np.uint32) for b in outs[:3])
    assert np.array_equal(batched, want) and np.array_equal(single, want)
    assert any(s.endswith(f"_glu_{tname}") for s in shaders) == fused
    hg, hu = (ref.matmul(x, ref.dequantize(raw, tname, cols)).astype(np.float64) for raw in raws)
    assert np.allclose(want.view(np.float32).reshape(n, rows), hg / (1 + np.exp(-hg)) * hu, rtol=1e-3, atol=1e-3)
    for b in (g, gate, up, xb, scratch, *outs):
        b.destroy()
