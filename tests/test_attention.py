"""Fused attention: batch invariance (bit-identity however queries are batched or chunked),
graph replay with a rewritten first_pos, and shape validation."""
from __future__ import annotations

import numpy as np
import pytest

from vkdflash.conformance import rng, uniform
from vkdflash.conformance.attention import make_cache, upload_cache
from vkdflash.errors import VkdflashError
from vkdflash.kernels.attention import attention
from vkdflash.kernels.types import CACHE_TYPES
from vkdflash.ref.attention import attention as ref_attention
from vkdflash.runtime.graph import Graph

HD, N_HEAD, N_HEAD_KV = 64, 4, 2
N_BLOCK = 64   # queries in the largest batch
FIRST = 21     # cache position of query 0


class Setup:
    """A cache with N_BLOCK queries after FIRST positions of context, plus a params buffer with
    one first_pos slot per dispatch (slots are aligned so each can be bound on its own)."""

    def __init__(self, ctx, kind, n_slots):
        r = rng("test_attention", kind)
        n_ctx = FIRST + N_BLOCK
        self.k_raw, self.k = make_cache(r, kind, n_ctx, N_HEAD_KV, HD)
        self.v_raw, self.v = make_cache(r, kind, n_ctx, N_HEAD_KV, HD)
        self.q = uniform(r, N_BLOCK, N_HEAD, HD)
        self.ctx, self.kind = ctx, kind
        (self.kb, self.kv), (self.vb, self.vv) = upload_cache(ctx, self.k_raw), upload_cache(ctx, self.v_raw)
        self.qb = ctx.upload(self.q)
        self.stride = max(4, ctx.features.min_storage_buffer_offset_alignment)
        self.params = ctx.buffer(self.stride * n_slots)
        self.q_bytes = N_HEAD * HD * 4  # one query

    def out(self, n_q):
        return self.ctx.buffer(n_q * self.q_bytes)

    def dispatch(self, g, slot, first_pos, q_index, n_q, out, out_index, mask="causal", q_buf=None, texel=None):
        """Record queries q_index.. (n_q of them) at cache positions first_pos.. into out[out_index..]."""
        self.params.write(np.array([first_pos], np.uint32), slot * self.stride)
        q_buf = self.qb if q_buf is None else q_buf
        attention(g, q_buf.view(q_index * self.q_bytes, n_q * self.q_bytes), self.kv, self.vv,
                  out.view(out_index * self.q_bytes, n_q * self.q_bytes),
                  self.params.view(slot * self.stride, 4), n_q, N_HEAD, N_HEAD_KV, HD,
                  self.kind, self.kind, mask, texel=texel)

    def destroy(self):
        for b in (self.kb, self.vb, self.qb, self.params):
            b.destroy()


def read(buf, n_q):
    return buf.read(np.float32).reshape(n_q, N_HEAD, HD)


@pytest.mark.parametrize("kind", CACHE_TYPES)
def test_causal_batch_invariance(ctx, kind):
    """The N_BLOCK queries in one batch, and chunked into batches of every size 1..N_BLOCK
    (size 1 = each query alone): all bit-identical."""
    chunkings = [[(c, min(n, N_BLOCK - c)) for c in range(0, N_BLOCK, n)] for n in range(1, N_BLOCK + 1)]
    s = Setup(ctx, kind, sum(len(ch) for ch in chunkings))
    outs = [s.out(N_BLOCK) for _ in chunkings]
    g, slot = Graph(ctx), 0
    for chunks, out in zip(chunkings, outs):
        for start, n_q in chunks:
            s.dispatch(g, slot, FIRST + start, start, n_q, out, start)
            slot += 1
    g.run()
    whole = read(outs[-1], N_BLOCK)
    want = ref_attention(s.q, s.k, s.v, FIRST, "causal")
    assert np.sum((whole - want) ** 2) / np.sum(want ** 2) < 5e-4
    for n, out in enumerate(outs, 1):
        got = read(out, N_BLOCK)
        bad = np.flatnonzero((got.view(np.uint32) != whole.view(np.uint32)).any(axis=(1, 2)))
        assert bad.size == 0, f"{kind}: chunks of {n} differ from one batch of {N_BLOCK} at queries {bad[:8]}"
    g.destroy(), s.destroy()
    for out in outs:
        out.destroy()


@pytest.mark.parametrize("kind", CACHE_TYPES)
def test_block_mask_invariance(ctx, kind):
    """Block mask: each query of a block of n equals, bit for bit, the same query computed alone
    as the block's last position (it sees exactly the same positions); permuting the block's
    queries permutes the outputs and nothing else."""
    sizes = (1, 2, 7, 16, N_BLOCK)
    s = Setup(ctx, kind, len(sizes) * 2 + sum(sizes))
    perm = np.random.default_rng(0).permutation(N_BLOCK)
    q_perm = s.ctx.upload(np.ascontiguousarray(s.q[perm]))
    g, slot, runs = Graph(ctx), 0, []
    for n in sizes:
        block, alone, shuffled = s.out(n), s.out(n), s.out(n)
        s.dispatch(g, slot, FIRST, 0, n, block, 0, "block")
        for i in range(n):
            s.dispatch(g, slot + 1 + i, FIRST + n - 1, i, 1, alone, i, "causal")
        slot += n + 1
        if n == N_BLOCK:
            s.dispatch(g, slot, FIRST, 0, n, shuffled, 0, "block", q_buf=q_perm)
            slot += 1
        runs.append((n, block, alone, shuffled))
    g.run()
    for n, block, alone, shuffled in runs:
        got = read(block, n)
        want = ref_attention(s.q[:n], s.k, s.v, FIRST, "block")
        assert np.sum((got - want) ** 2) / np.sum(want ** 2) < 5e-4
        assert np.array_equal(got.view(np.uint32), read(alone, n).view(np.uint32)), \
            f"{kind}: block of {n} differs from its queries computed alone"
        if n == N_BLOCK:
            assert np.array_equal(read(shuffled, n).view(np.uint32), got[perm].view(np.uint32)), \
                f"{kind}: permuting the block's queries changed their outputs"
        for b in (block, alone, shuffled):
            b.destroy()
    g.destroy(), s.destroy(), q_perm.destroy()


@pytest.mark.parametrize("mask", ["causal", "block"])
def test_replay_with_rewritten_first_pos(ctx, mask):
    """One recorded graph, replayed after rewriting the params buffer: each replay answers for
    the new first_pos without re-recording."""
    s = Setup(ctx, "q8_0", 1)
    n_q = 5
    out = s.out(n_q)
    g = Graph(ctx)
    s.dispatch(g, 0, 0, 0, n_q, out, 0, mask)
    for first_pos in (0, 3, 40, FIRST + N_BLOCK - n_q, 17):
        s.params.write(np.array([first_pos], np.uint32))
        g.run()
        got, want = read(out, n_q), ref_attention(s.q[:n_q], s.k, s.v, first_pos, mask)
        err = np.sum((got - want) ** 2) / np.sum(want ** 2)
        assert err < 5e-4, f"first_pos {first_pos}: NMSE {err:.3g}"
    assert len(g) == 1
    g.destroy(), out.destroy(), s.destroy()


@pytest.mark.parametrize("mask", ["causal", "block"])
def test_tiling_gives_same_bits(ctx, mask, monkeypatch):
    """However many heads (G) and queries (QT) share a workgroup, every row gets the same bits."""
    import vkdflash.kernels.attention as ka
    s = Setup(ctx, "q4_0", 1)
    n_q, outs = 7, []
    for g, qt in ((1, 1), (2, 1), (1, 3), (2, 2)):
        monkeypatch.setattr(ka, "tile", lambda n_q, gqa, hd, g=g, qt=qt: (g, qt))
        out, gr = s.out(n_q), Graph(ctx)
        s.dispatch(gr, 0, FIRST, 0, n_q, out, 0, mask)
        gr.run()
        outs.append(read(out, n_q))
        gr.destroy(), out.destroy()
    for got in outs[1:]:
        assert np.array_equal(got.view(np.uint32), outs[0].view(np.uint32))
    s.destroy()


@pytest.mark.parametrize("kind", ["f16", "q5_1"])
def test_texel_and_storage_loads_give_same_bits(ctx, kind):
    s = Setup(ctx, kind, 1)
    n_q, outs = 5, []
    for texel in (True, False):
        out, gr = s.out(n_q), Graph(ctx)
        s.dispatch(gr, 0, FIRST, 0, n_q, out, 0, texel=texel)
        gr.run()
        outs.append((read(out, n_q), {d.pipeline.shader for d in gr._dispatches}))
        gr.destroy(), out.destroy()
    (fast, fast_shaders), (slow, slow_shaders) = outs
    assert fast_shaders == {"flash_attn_texel"} and slow_shaders == {"flash_attn"}
    assert np.array_equal(fast.view(np.uint32), slow.view(np.uint32))
    s.destroy()


@pytest.mark.parametrize("kind", ["f16", "q4_0"])
def test_shuffle_and_shared_merges_give_same_bits(ctx, kind, monkeypatch):
    """The lanes' states merge by subgroup shuffles where the device allows, else through shared
    memory: the same sums in the same lane order, so the same bits, rotated Q or not."""
    import vkdflash.kernels.attention as ka
    if not ka.shuffle_merge(ctx.features):
        pytest.skip(f"subgroup of {ctx.features.subgroup_size} lanes without shuffles: shared merge only")
    s = Setup(ctx, kind, 1)
    n_q, outs = 6, []
    for shuffle in (True, False):
        monkeypatch.setattr(ka, "shuffle_merge", lambda features, shuffle=shuffle: shuffle)
        out, gr = s.out(n_q), Graph(ctx)
        s.params.write(np.array([FIRST], np.uint32))
        attention(gr, s.qb.view(0, n_q * s.q_bytes), s.kv, s.vv, out.view(), s.params.view(0, 4), n_q,
                  N_HEAD, N_HEAD_KV, HD, kind, kind, q_rotation=64 if kind == "q4_0" else 0)
        gr.run()
        outs.append((read(out, n_q), gr._dispatches[0].pipeline))
        gr.destroy(), out.destroy()
    (shuffled, p_shuffle), (shared, p_shared) = outs
    assert p_shuffle is not p_shared  # two specializations really ran
    assert np.array_equal(shuffled.view(np.uint32), shared.view(np.uint32))
    s.destroy()


@pytest.mark.parametrize("kind", ["f16", "q4_0"])
@pytest.mark.parametrize("n_q", [1, 7])
def test_packed_workgroups_give_same_bits(ctx, kind, n_q, monkeypatch):
    """Groups of lanes packed into one workgroup (along heads for one query, along queries for
    more) give each row the bits it gets alone, with a last part that has nothing to do: 3 heads
    on one kv head (the cache rows read as one head each) and 7 queries."""
    import vkdflash.kernels.attention as ka
    if not ka.shuffle_merge(ctx.features) or ka.pack(ctx.features) < 2:
        pytest.skip(f"a subgroup of {ctx.features.subgroup_size} lanes holds one group")
    monkeypatch.setattr(ka, "tile", lambda n_q, gqa, hd: (1, 1))
    s = Setup(ctx, kind, 1)
    n_head, q_bytes = 3, 3 * HD * 4
    outs = []
    for pk in (1, ka.pack(ctx.features)):
        monkeypatch.setattr(ka, "pack", lambda features, pk=pk: pk)
        out, gr = ctx.buffer(n_q * q_bytes), Graph(ctx)
        s.params.write(np.array([FIRST], np.uint32))
        attention(gr, s.qb.view(0, n_q * q_bytes), s.kv, s.vv, out.view(), s.params.view(0, 4), n_q,
                  n_head, 1, HD, kind, kind, q_rotation=64 if kind == "q4_0" else 0)
        gr.run()
        outs.append((out.read(np.float32), gr._dispatches[0].groups))
        gr.destroy(), out.destroy()
    (alone, groups1), (packed, groups2) = outs
    assert groups1 != groups2  # the packed run really ran fewer workgroups
    assert np.isfinite(alone).all()
    assert np.array_equal(alone.view(np.uint32), packed.view(np.uint32))
    s.destroy()


def test_visible_length_clamped_to_cache(ctx):
    """Queries whose visible range runs past the bound cache rows read only those rows."""
    s = Setup(ctx, "f16", 1)
    n_q, first_pos = 5, FIRST + N_BLOCK - 2
    out, g = s.out(n_q), Graph(ctx)
    s.dispatch(g, 0, first_pos, 0, n_q, out, 0)
    g.run()
    got, want = read(out, n_q), ref_attention(s.q[:n_q], s.k, s.v, first_pos)
    assert np.sum((got - want) ** 2) / np.sum(want ** 2) < 5e-4
    g.destroy(), out.destroy(), s.destroy()


@pytest.mark.parametrize("kwargs, message", [
    (dict(head_dim=48), "head_dim"),
    (dict(head_dim=0), "head_dim"),
    (dict(head_dim=512), "head_dim"),
    (dict(n_head=5), "n_head"),
    (dict(n_head_kv=0), "n_head"),
    (dict(n_q=0), "n_q"),
    (dict(mask="sliding"), "mask"),
    (dict(k_type="q4_k"), "cache type"),
    (dict(v_type="nope"), "unknown tensor type"),
    (dict(q_bytes=100), "Q holds"),
    (dict(out_bytes=100), "output holds"),
    (dict(k_bytes=10), "no full row"),
    (dict(p_bytes=0), "params"),
    (dict(k_bytes=2 * 64 * 2 * 8 + 2), "16-byte boundary"),
])
def test_bad_shapes_raise(ctx, kwargs, message):
    args = dict(n_q=2, n_head=4, n_head_kv=2, head_dim=64, k_type="f16", v_type="q4_0", mask="causal")
    sizes = dict(q_bytes=2 * 4 * 64 * 4, out_bytes=2 * 4 * 64 * 4, k_bytes=2 * 64 * 2 * 8, p_bytes=4)
    for key in list(kwargs):
        (sizes if key in sizes else args)[key] = kwargs[key]
    buf = ctx.buffer(1 << 16)
    k_off = (1 << 16) - sizes["k_bytes"]  # a K cache ending at the buffer's end
    views = [buf.view(0, sizes["q_bytes"]), buf.view(k_off, sizes["k_bytes"]), buf.view(0, 4096)] + \
            [buf.view(0, sizes[k]) for k in ("out_bytes", "p_bytes")]
    g = Graph(ctx)
    with pytest.raises(VkdflashError, match=message):
        attention(g, *views, **args)
    assert len(g) == 0
    g.destroy(), buf.destroy()


def test_cache_nbytes_rounds_rows_up_to_16_bytes():
    from vkdflash.kernels.attention import cache_nbytes
    assert cache_nbytes("q4_0", 3, 1, 32) == 64      # 3 rows of 18 bytes
    assert cache_nbytes("f16", 8, 2, 64) == 8 * 256   # already a multiple of 16
