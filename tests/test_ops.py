"""Row kernels (rms_norm, rope, elementwise, softmax, argmax): batch invariance, graph replay with
rewritten positions, in-place use, and one-line errors for bad shapes."""
from __future__ import annotations

import numpy as np
import pytest

from vkdflash.conformance import NMSE_DEFAULT, NMSE_SOFTMAX, nmse
from vkdflash.errors import VkdflashError
from vkdflash.kernels import elementwise, rows
from vkdflash.kernels.norm import rms_norm
from vkdflash.kernels.rope import rope
from vkdflash.kernels.softmax import argmax, softmax
from vkdflash.ref import ops
from vkdflash.runtime.graph import Graph

SIZES = range(1, 65)
ALIGN = 256


@pytest.fixture(params=["one-subgroup", "four-subgroups"])
def wg_ctx(request, ctx, monkeypatch):
    """The device's own workgroup, and one of four subgroups (exercises the shared-memory step)."""
    if request.param == "four-subgroups":
        monkeypatch.setattr(rows, "workgroup", lambda c: 4 * c.features.subgroup_size)
    return ctx


def _pack(ctx, arrays):
    """One buffer holding every array at an aligned offset, and a view of each."""
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-max(a.nbytes, 4) // ALIGN) * ALIGN
    buf = ctx.buffer(total)
    for a, off in zip(arrays, offsets):
        buf.write(a, off)
    return buf, [buf.view(off, a.nbytes) for a, off in zip(arrays, offsets)]


def _batch_invariance(ctx, inputs, out_row, record):
    """Run every batch size 1..64, each on a different slice of the 64 rows of `inputs`, in one
    graph; every row must come out bit-identical to the same row of the 64-row batch."""
    starts = {n: (7 * n) % (65 - n) for n in SIZES}
    packed = [_pack(ctx, [a[starts[n]:starts[n] + n] for n in SIZES]) for a in inputs]
    out_buf, out_views = _pack(ctx, [np.zeros((n, *out_row.shape), out_row.dtype) for n in SIZES])
    g = Graph(ctx)
    for k, n in enumerate(SIZES):
        record(g, *[views[k] for _, views in packed], out_views[k], n)
    g.run()
    got = {n: out_buf.read(out_row.dtype, n * out_row.size, v.offset).reshape(n, *out_row.shape)
           for n, v in zip(SIZES, out_views)}
    g.destroy(), out_buf.destroy()
    for buf, _ in packed:
        buf.destroy()
    full = got[64]
    for n in SIZES:
        same = got[n].view(np.uint8) == full[starts[n]:starts[n] + n].view(np.uint8)
        assert same.all(), f"batch of {n} rows differs from the 64-row batch"
    return full


def _data(*shape, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


@pytest.mark.parametrize("dim", [576, 1001])
def test_rms_norm_batch_invariant(wg_ctx, dim):
    x, w = _data(64, dim), _data(dim, seed=1)
    wb = wg_ctx.upload(w)
    full = _batch_invariance(wg_ctx, [x], np.zeros(dim, np.float32),
                             lambda g, xv, ov, n: rms_norm(g, xv, wb, ov, n, dim, 1e-6))
    assert nmse(full, ops.rms_norm(x, w, 1e-6)) < NMSE_DEFAULT
    wb.destroy()


def test_per_head_rms_norm_batch_invariant(wg_ctx):
    heads, hd = 8, 128
    x, w = _data(64, heads, hd), _data(hd, seed=1)
    wb = wg_ctx.upload(w)
    full = _batch_invariance(wg_ctx, [x], np.zeros((heads, hd), np.float32),
                             lambda g, xv, ov, n: rms_norm(g, xv, wb, ov, n * heads, hd, 1e-6))
    assert nmse(full, ops.rms_norm(x, w, 1e-6)) < NMSE_DEFAULT
    wb.destroy()


@pytest.mark.parametrize("mode", ["normal", "neox"])
def test_rope_batch_invariant(wg_ctx, mode):
    heads, hd = 4, 64
    x = _data(64, heads, hd)
    pos = np.random.default_rng(2).integers(0, 8193, 64).astype(np.int32)
    full = _batch_invariance(wg_ctx, [x, pos], np.zeros((heads, hd), np.float32),
                             lambda g, xv, pv, ov, n: rope(g, xv, pv, ov, n, heads, hd, 1e6, mode))
    assert nmse(full, ops.rope(x, pos, 1e6, mode)) < NMSE_DEFAULT


@pytest.mark.parametrize("cols", [1001, 4096])
def test_softmax_batch_invariant(wg_ctx, cols):
    x = _data(64, cols) * 8
    full = _batch_invariance(wg_ctx, [x], np.zeros(cols, np.float32),
                             lambda g, xv, ov, n: softmax(g, xv, ov, n, cols, 0.5))
    assert nmse(full, ops.softmax(x, 0.5)) < NMSE_SOFTMAX


@pytest.mark.parametrize("cols", [3001, 3000])
def test_argmax_batch_invariant(wg_ctx, cols):
    x = np.round(_data(64, cols) * 64) / 64  # plenty of ties
    full = _batch_invariance(wg_ctx, [x], np.zeros(1, np.uint32),
                             lambda g, xv, ov, n: argmax(g, xv, ov, n, cols))
    assert np.array_equal(full[:, 0], ops.argmax(x))


def test_texel_and_storage_variants_give_same_bits(ctx, monkeypatch):
    """The one-subgroup texel variants (rms_norm, argmax) against the storage-buffer ones."""
    if rows.texel_inputs(ctx, ctx.buffer(16).view()) is None:
        pytest.skip("this device takes the storage-buffer variants only")
    x, w = _data(5, 576) * 8, _data(576, seed=1)

    def run():
        xb, wb, yb, ib = ctx.upload(x), ctx.upload(w), ctx.buffer(x.nbytes), ctx.buffer(5 * 4)
        g = Graph(ctx)
        rms_norm(g, xb, wb, yb, 5, 576, 1e-6)
        argmax(g, xb, ib, 5, 576)
        g.run()
        got = yb.read(np.uint32), ib.read(np.uint32)
        g.destroy()
        for b in (xb, wb, yb, ib):
            b.destroy()
        return got

    texel = run()
    monkeypatch.setattr(rows, "texel_inputs", lambda c, *views: None)
    storage = run()
    assert np.array_equal(texel[0], storage[0]) and np.array_equal(texel[1], storage[1])
    assert np.array_equal(texel[1], ops.argmax(x))


@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("n_rot", [64, 32, 24])
def test_rope_texel_and_storage_variants_give_same_bits(ctx, monkeypatch, mode, n_rot):
    """rope_texel (4 pairs a lane, vec4 accesses) against rope, with Q and K in one dispatch and
    part of each head passing through; n_rot 24 is not a multiple of 8: the storage variant."""
    import vkdflash.kernels.rope as rope_mod
    x, k = _data(3, 4, 64), _data(3, 2, 64, seed=1)
    pos = np.array([0, 7, 123456], np.int32)

    def run():
        xb, kb, pb = ctx.upload(x), ctx.upload(k), ctx.upload(pos)
        g = Graph(ctx)
        rope(g, xb, pb, xb, 3, 4, 64, 1e4, mode, n_rot=n_rot, second=(kb, kb, 2))
        g.run()
        got = xb.read(np.uint32), kb.read(np.uint32)
        g.destroy()
        for b in (xb, kb, pb):
            b.destroy()
        return got

    texel = run()
    monkeypatch.setattr(rope_mod, "texel_views", lambda ctx, views, fmt="f32x4": None)
    storage = run()
    assert np.array_equal(texel[0], storage[0]) and np.array_equal(texel[1], storage[1])
    want = ops.rope(x, pos, 1e4, mode, n_rot=n_rot)
    assert nmse(texel[0].view(np.float32).reshape(x.shape), want) < NMSE_DEFAULT


@pytest.mark.parametrize("op", ["add", "mul", "swiglu", "scale"])
def test_elementwise_batch_invariant(wg_ctx, op):
    width = 100
    a, b = _data(64, width) * 4, _data(64, width, seed=1)

    def record(g, av, bv, ov, n):
        if op == "scale":
            elementwise.scale(g, av, ov, n * width, 0.3)
        else:
            getattr(elementwise, op)(g, av, bv, ov, n * width)
    full = _batch_invariance(wg_ctx, [a, b], np.zeros(width, np.float32), record)
    want = ops.scale(a, 0.3) if op == "scale" else getattr(ops, op)(a, b)
    assert nmse(full, want) < NMSE_DEFAULT


def test_rope_replay_reads_rewritten_positions(ctx):
    n_tokens, heads, hd = 5, 3, 128
    x = _data(n_tokens, heads, hd)
    xb, out = ctx.upload(x), ctx.buffer(x.nbytes)
    pb = ctx.upload(np.arange(n_tokens, dtype=np.int32))
    g = Graph(ctx)
    rope(g, xb, pb, out, n_tokens, heads, hd, 10000.0, "neox")
    results = []
    for start in (0, 7, 8000):
        pos = np.arange(start, start + n_tokens, dtype=np.int32)
        pb.write(pos)
        g.run()
        got = out.read(np.float32).reshape(x.shape)
        assert nmse(got, ops.rope(x, pos, 10000.0, "neox")) < NMSE_DEFAULT
        results.append(got)
    assert not np.array_equal(results[0], results[1])
    g.destroy(), xb.destroy(), out.destroy(), pb.destroy()


@pytest.mark.parametrize("mode", ["normal", "neox"])
def test_rope_second_tensor_is_a_rope_of_its_own(ctx, mode):
    """Q and K turned in one dispatch give the bits of two rope calls (in place, as the block does)."""
    n_tokens, hd = 4, 64
    q, k = _data(n_tokens, 9, hd), _data(n_tokens, 3, hd, seed=2)
    pos = np.array([0, 5, 77, 4095], np.int32)
    pb = ctx.upload(pos)
    pair, alone = [ctx.upload(q), ctx.upload(k)], [ctx.upload(q), ctx.upload(k)]
    g = Graph(ctx)
    rope(g, pair[0], pb, pair[0], n_tokens, 9, hd, 10000.0, mode, second=(pair[1], pair[1], 3))
    rope(g, alone[0], pb, alone[0], n_tokens, 9, hd, 10000.0, mode)
    rope(g, alone[1], pb, alone[1], n_tokens, 3, hd, 10000.0, mode)
    g.run()
    for a, b in zip(pair, alone):
        assert np.array_equal(a.read(np.uint32), b.read(np.uint32))
    assert nmse(pair[1].read(np.float32).reshape(k.shape), ops.rope(k, pos, 10000.0, mode)) < NMSE_DEFAULT
    for b in pair + alone + [pb]:
        b.destroy()
    g.destroy()


def test_in_place(ctx):
    x, w = _data(6, 4, 64), _data(64, seed=1)
    pos = np.array([3, 1, 4, 1, 5, 9], np.int32)
    bufs = [ctx.upload(x) for _ in range(4)]
    wb, pb = ctx.upload(w), ctx.upload(pos)
    g = Graph(ctx)
    rms_norm(g, bufs[0], wb, bufs[0], 24, 64, 1e-5)
    rope(g, bufs[1], pb, bufs[1], 6, 4, 64, 10000.0, "normal")
    softmax(g, bufs[2], bufs[2], 24, 64)
    elementwise.swiglu(g, bufs[3], bufs[3], bufs[3], x.size)
    g.run()
    wants = [ops.rms_norm(x, w, 1e-5), ops.rope(x, pos, 10000.0), ops.softmax(x), ops.swiglu(x, x)]
    for buf, want in zip(bufs, wants):
        assert nmse(buf.read(np.float32).reshape(x.shape), want) < NMSE_DEFAULT
    g.destroy()
    for b in bufs + [wb, pb]:
        b.destroy()


def test_rope_modes_are_told_apart(ctx):
    """The rope reference is sensitive enough that the wrong pairing fails."""
    x = _data(2, 2, 64)
    pos = np.array([5, 9], np.int32)
    assert nmse(ops.rope(x, pos, 1e4, "normal"), ops.rope(x, pos, 1e4, "neox")) > 1e-2


def test_bad_shapes_raise(ctx):
    small, pos = ctx.buffer(64), ctx.upload(np.zeros(4, np.int32))
    big = ctx.buffer(1 << 16)
    g = Graph(ctx)
    bad = [
        lambda: rms_norm(g, small, big, big, 2, 64, 1e-5),           # x too small
        lambda: rms_norm(g, big, big, big, 0, 64, 1e-5),             # no rows
        lambda: rms_norm(g, big, big, big, 2, 64, -1.0),             # negative eps
        lambda: rope(g, big, pos, big, 4, 2, 63, 1e4),               # odd head_dim
        lambda: rope(g, big, pos, big, 4, 2, 64, 1e4, n_rot=128),    # n_rot > head_dim
        lambda: rope(g, big, pos, big, 4, 2, 64, 1e4, mode="glm"),   # unknown mode
        lambda: rope(g, big, pos, big, 8, 2, 64, 1e4),               # positions too short
        lambda: rope(g, big, pos, big, 4, 2, 64, 1e4, freq_factors=np.ones(3)),
        lambda: softmax(g, big, small, 4, 64),                       # out too small
        lambda: argmax(g, big, small, 17, 64),                       # 17 indices > 64 bytes
        lambda: elementwise.add(g, big, small, big, 1024),
        lambda: elementwise.scale(g, big, big, 0, 2.0),
    ]
    for i, call in enumerate(bad):
        with pytest.raises(VkdflashError):
            call()
    assert len(g) == 0, "a rejected call must record nothing"
    g.destroy(), small.destroy(), pos.destroy(), big.destroy()


def test_row_longer_than_the_loop_limit_raises(ctx):
    """On lavapipe a lane may loop at most 65535 times; such a row is refused, not truncated."""
    cols = 4 * rows.workgroup(ctx) * (rows.MAX_ITERATIONS + 1)
    view = ctx.buffer(4).view(0, 4)
    fake = type(view)(view.buffer, 0, cols * 4)  # never dispatched: the check comes first
    g = Graph(ctx)
    with pytest.raises(VkdflashError, match="loop iterations"):
        argmax(g, fake, fake, 1, cols)
    g.destroy(), view.buffer.destroy()
