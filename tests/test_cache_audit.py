"""The KV cache under speculative decoding, audited against the numpy references (ref/kv.py,
ref/attention.py; thresholds docs/design.md section 7): rollback (write k+1 rows, truncate to
the accepted count, rewrite) with every cache type, rotation on and off; nothing stale past the
pass leaks into attention; context edges (n_ctx 1, a context no tile divides, filled exactly,
a write past the end, lavapipe's loop limit); head dims 32..256 and llama.cpp's rotation rule;
K and V of different types with GQA 1, 3, 8; a kv_cache_write wrapper cannot change the rows it
observes."""
from __future__ import annotations

import numpy as np
import pytest

from vkdflash import plugins
from vkdflash.conformance import NMSE_ATTENTION, nmse
from vkdflash.errors import VkdflashError
from vkdflash.hookspecs import hookimpl
from vkdflash.kernels.attention import attention, max_positions
from vkdflash.kernels.hadamard import fwht
from vkdflash.kernels.types import CACHE_TYPES, get_type
from vkdflash.kv_cache import KVCache
from vkdflash.ref.attention import attention as ref_attention
from vkdflash.ref.hadamard import rotation_block
from vkdflash.ref.kv import KVCache as RefCache
from vkdflash.ref.quantize import dequantize, quant_step
from vkdflash.runtime.graph import Graph
from vkdflash.spec.strategy import KVHandle


class Pair:
    """A GPU cache (written and read through a KVHandle) beside the numpy reference cache."""

    def __init__(self, ctx, ctk, ctv, head_dim=64, n_head_kv=2, n_head=4, n_ctx=24, rotate=True, name="audit"):
        self.ctx, self.ctk, self.ctv = ctx, ctk, ctv
        self.hd, self.n_head_kv, self.n_head, self.width = head_dim, n_head_kv, n_head, n_head_kv * head_dim
        self.cache = KVCache(ctx, 1, n_ctx, n_head_kv, head_dim, ctk, ctv, rotate, name=name)
        self.handle = KVHandle(self.cache)
        self.ref = RefCache(1, n_head_kv, head_dim, ctk, ctv, rotate=rotate)

    def write(self, first, k, v, ref=True):
        self.handle.write(self.ctx, 0, k, v, np.arange(first, first + len(k)))
        if ref:
            self.ref.write(0, first, k.reshape(-1, self.n_head_kv, self.hd), v.reshape(-1, self.n_head_kv, self.hd))

    def raw(self, half, n):
        t = self.ctk if half == "k" else self.ctv
        rb = get_type(t).row_bytes(self.width)
        return (self.cache.k if half == "k" else self.cache.v)[0].read(np.uint8, n * rb).reshape(n, rb)

    def check_bytes(self):
        """The stored rows are the reference's bytes (iq4_nl: within one quant step, as in conformance)."""
        n = self.ref.n
        for half, t in (("k", self.ctk), ("v", self.ctv)):
            got, want = self.raw(half, n), self.ref.raw(0, half).reshape(n, -1)
            if t == "iq4_nl":
                off = np.abs(dequantize(got, t) - dequantize(want, t)) / np.maximum(quant_step(want, t), 1e-30)
                assert off.max() <= 1 + 1e-6, f"{half}: {off.max():.2f} quant steps off"
            else:
                assert np.array_equal(got, want), f"{half}: rows {np.flatnonzero((got != want).any(1))} differ"

    def attend(self, q, first, mask="causal"):
        qb, out = self.ctx.upload(q), self.ctx.buffer(q.nbytes)
        params = self.ctx.upload(np.array([first, 0, 0, 0], np.uint32))
        g = Graph(self.ctx)
        try:
            self.handle.attend(g, 0, qb, out, params, len(q), self.n_head, mask)
            g.run()
            return out.read(np.float32).reshape(len(q), self.n_head, self.hd)
        finally:
            g.destroy()
            for b in (qb, out, params):
                b.destroy()

    def check_attention(self, q, first, mask="causal"):
        got = self.attend(q, first, mask)
        want = self.ref.attend(0, q.reshape(len(q), self.n_head, self.hd), first, mask)
        assert np.isfinite(got).all()
        err = nmse(got, want)
        assert err <= NMSE_ATTENTION, f"{self.ctk}/{self.ctv} hd {self.hd}: attention NMSE {err:.3g} ({mask})"
        return got

    def close(self):
        self.cache.destroy()


def rows(r, n, width):
    x = r.uniform(-1, 1, (n, width)).astype(np.float32)
    x[:, ::17] *= 8  # outlier channels: what the rotation is for
    return x


def queries(r, n, p):
    return r.uniform(-1, 1, (n, p.n_head * p.hd)).astype(np.float32)


# -- (1) rollback: speculation writes k+1 rows, keeps the accepted ones, the next pass rewrites ----

@pytest.mark.parametrize("rotate", [True, False], ids=["rotated", "unrotated"])
@pytest.mark.parametrize("ctype", CACHE_TYPES)
def test_a_rolled_back_position_holds_what_a_plain_write_stores(ctx0, ctype, rotate):
    """Cache a: 10 committed rows, a 6-row verify pass at 10..15, truncate to 12 (1 + 1 accepted),
    the next 2-row pass at 12..13 (14, 15 stay stale). Cache b: the same rows written plainly.
    Same bytes (and the reference's), bit-identical attention, within NMSE of the reference."""
    r = np.random.default_rng(CACHE_TYPES.index(ctype) + 10 * rotate)
    a, b = Pair(ctx0, ctype, ctype, rotate=rotate, name="a"), Pair(ctx0, ctype, ctype, rotate=rotate, name="b")
    try:
        w = a.width
        ctx_k, ctx_v, spec_k, spec_v, next_k, next_v = (rows(r, n, w) for n in (10, 10, 6, 6, 2, 2))
        for p in (a, b):
            p.write(0, ctx_k, ctx_v)
        a.write(10, spec_k, spec_v, ref=False)  # the verify pass
        a.cache.n_past = 16
        a.cache.truncate(12)                    # two of its rows accepted
        assert a.cache.n_past == 12
        a.ref.write(0, 10, spec_k[:2].reshape(2, 2, 64), spec_v[:2].reshape(2, 2, 64))
        b.write(10, spec_k[:2], spec_v[:2], ref=False)
        for p in (a, b):
            p.write(12, next_k, next_v, ref=p is a)  # the next pass
        for half in "kv":
            assert np.array_equal(a.raw(half, 14), b.raw(half, 14)), f"{half}: rewritten rows differ from a plain write"
        a.check_bytes()
        q = queries(r, 2, a)
        for mask in ("causal", "block"):
            got = a.check_attention(q, 12, mask)
            assert np.array_equal(got.view(np.uint32), b.attend(q, 12, mask).view(np.uint32)), \
                f"stale rows 14, 15 changed attention ({mask})"
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("ctype, rotate", [("f16", True), ("f32", False), ("q8_0", True), ("q4_0", False)])
@pytest.mark.parametrize("n_q, mask", [(1, "causal"), (5, "causal"), (5, "block")])
def test_rows_past_the_pass_never_reach_attention(ctx0, ctype, rotate, n_q, mask):
    """Rejected drafts left huge (or, in a plain cache, NaN) rows past the next pass: attention of
    that pass, one query or several, causal or DFlash's block mask, matches a reference that never
    held them."""
    r = np.random.default_rng(n_q)
    p = Pair(ctx0, ctype, ctype, n_head_kv=1, n_head=3, n_ctx=30, rotate=rotate)
    try:
        w = p.width
        p.write(0, rows(r, 10, w), rows(r, 10, w))
        bad = np.full((12, w), np.nan if ctype in ("f16", "f32") else 3e4, np.float32)
        p.write(10, bad, -bad, ref=False)
        p.cache.truncate(10)
        p.write(10, rows(r, n_q, w), rows(r, n_q, w))
        p.check_attention(queries(r, n_q, p), 10, mask)
    finally:
        p.close()


# -- (2) context edges ----------------------------------------------------------------------

@pytest.mark.parametrize("ctype", ["f16", "q8_0", "q4_1"])
def test_a_cache_of_one_position(ctx0, ctype):
    r = np.random.default_rng(1)
    p = Pair(ctx0, ctype, ctype, n_ctx=1)
    try:
        p.write(0, rows(r, 1, p.width), rows(r, 1, p.width))
        p.check_bytes()
        for mask in ("causal", "block"):
            p.check_attention(queries(r, 1, p), 0, mask)
        before = [p.raw(h, 1).copy() for h in "kv"]
        for pos in ([1], [0, 1]):
            with pytest.raises(VkdflashError, match=r"^cache position 1 is outside the cache \(n_ctx 1\)$"):
                p.handle.write(ctx0, 0, rows(r, len(pos), p.width), rows(r, len(pos), p.width), pos)
        assert all(np.array_equal(x, p.raw(h, 1)) for x, h in zip(before, "kv")), "a refused write changed the cache"
    finally:
        p.close()


@pytest.mark.parametrize("ctype", ["q5_0", "iq4_nl"])
def test_a_context_no_tile_divides_filled_exactly(ctx0, ctype):
    """n_ctx 37 (not a multiple of the 8 lanes, the query tiles or 16 bytes of rows) filled to the
    last position by a 7-row pass, then a pass past the end refused with nothing changed."""
    r = np.random.default_rng(2)
    p = Pair(ctx0, ctype, ctype, n_ctx=37)
    try:
        p.write(0, rows(r, 30, p.width), rows(r, 30, p.width))
        p.write(30, rows(r, 7, p.width), rows(r, 7, p.width))
        p.check_bytes()
        for mask in ("causal", "block"):
            p.check_attention(queries(r, 7, p), 30, mask)
        before = [p.raw(h, 37).copy() for h in "kv"]
        with pytest.raises(VkdflashError, match=r"cache position 37 is outside the cache \(n_ctx 37\)"):
            p.handle.write(ctx0, 0, rows(r, 2, p.width), rows(r, 2, p.width), [36, 37])
        assert all(np.array_equal(x, p.raw(h, 37)) for x, h in zip(before, "kv"))
    finally:
        p.close()


def test_truncate_takes_a_whole_number_of_positions(ctx0):
    """truncate(0.5) had set n_past to 0.5 (a forward pass then staged fractional positions), and
    truncate(None) raised a TypeError."""
    c = KVCache(ctx0, 1, 8, 1, 64, name="t")
    try:
        c.n_past = 5
        for bad in (0.5, None, True, "3", 9, -1):
            with pytest.raises(VkdflashError, match="^cannot truncate the t cache to .*: it has 8 positions$"):
                c.truncate(bad)
        assert c.n_past == 5
        c.truncate(np.int64(3))
        assert c.n_past == 3 and type(c.n_past) is int
        c.truncate(8)
        assert c.n_past == 3
    finally:
        c.destroy()


def _lavapipe_limit(ctx):
    most = max_positions(ctx.features)
    if most is None:
        pytest.skip("no loop limit on this device")
    return most


def test_a_context_past_lavapipe_loop_limit_is_refused(ctx0):
    """lavapipe stops a shader lane after 65535 loop iterations: attention over 600000 positions
    silently missed the last ones (NMSE 1.0). A cache that large is refused where it is made,
    and attention over bindings that large where it is recorded."""
    most = _lavapipe_limit(ctx0)
    with pytest.raises(VkdflashError, match=rf"n_ctx {most + 1} is more than attention can read .* at most {most} "):
        KVCache(ctx0, 1, most + 1, 1, 32, name="long")
    row = 64  # f16, one head of 32
    kv = ctx0.buffer((most + 1) * row)
    q, out, params = ctx0.buffer(128), ctx0.buffer(128), ctx0.upload(np.zeros(4, np.uint32))
    g = Graph(ctx0)
    try:
        with pytest.raises(VkdflashError, match=f"attention reads at most {most} cache positions"):
            attention(g, q, kv, kv, out, params, 1, 1, 1, 32, "f16", "f16")
        assert len(g) == 0
        attention(g, q, kv.view(0, most * row), kv.view(0, most * row), out, params, 1, 1, 1, 32, "f16", "f16")
    finally:
        g.destroy()
        for b in (kv, q, out, params):
            b.destroy()


@pytest.mark.slow
def test_attention_at_the_limit_reads_the_last_rows(ctx0):
    """At the limit itself the last positions still count (a few seconds on lavapipe; the same held
    with a rotated q4_0 cache of head_dim 256, whose Q rotation spends the most loop iterations)."""
    most = _lavapipe_limit(ctx0)
    r = np.random.default_rng(3)
    c = KVCache(ctx0, 1, most, 1, 32, name="long")
    h = KVHandle(c)
    try:
        q = r.uniform(-1, 1, (1, 32)).astype(np.float32)
        k = r.uniform(-0.1, 0.1, (most, 32)).astype(np.float32)
        v = np.zeros((most, 32), np.float32)
        k[-3:], v[-3:] = 8 * q, 5.0  # the last rows dominate the softmax
        h.write(ctx0, 0, k, v, np.arange(most))
        qb, out, params = ctx0.upload(q), ctx0.buffer(128), ctx0.upload(np.array([most - 1, 0, 0, 0], np.uint32))
        g = Graph(ctx0)
        h.attend(g, 0, qb, out, params, 1, 1)
        g.run()
        got = out.read(np.float32)
        g.destroy()
        for b in (qb, out, params):
            b.destroy()
        want = ref_attention(q.reshape(1, 1, 32), k.astype(np.float16).reshape(most, 1, 32),
                             v.astype(np.float16).reshape(most, 1, 32), most - 1)
        assert want.min() > 4 and nmse(got.reshape(want.shape), want) <= NMSE_ATTENTION, got[:4]
    finally:
        c.destroy()


# -- (3) head dims and llama.cpp's rotation rule ---------------------------------------------

@pytest.mark.parametrize("head_dim, k_block, v_block", [(32, 0, 0), (96, 0, 0), (128, 128, 64), (192, 64, 64),
                                                        (256, 256, 64)])
def test_which_head_dims_rotate(ctx0, head_dim, k_block, v_block):
    """llama.cpp rotates a quantized half iff head_dim % 64 == 0; K in the largest power of two
    >= 64 dividing head_dim, V in 64 (docs/design.md section 2); plain types never."""
    c = KVCache(ctx0, 1, 4, 1, head_dim, "q4_0", "q8_0", name="hd")
    plain = KVCache(ctx0, 1, 4, 1, head_dim, "f16", "bf16", name="plain")
    try:
        assert (c.k_rot, c.v_rot) == (k_block, v_block)
        assert (rotation_block("q4_0", head_dim, "k"), rotation_block("q8_0", head_dim, "v")) == (k_block, v_block)
        assert (plain.k_rot, plain.v_rot) == (0, 0)
    finally:
        c.destroy()
        plain.destroy()


@pytest.mark.parametrize("head_dim, ctype", [(80, "f16"), (48, "f32"), (80, "q8_0")])
def test_a_head_dim_attention_cannot_read_is_refused_where_the_cache_is_made(ctx0, head_dim, ctype):
    """An f16 cache of head_dim 80 was made, took writes (two heads make rows of 160 values), and
    failed only at attention; now it is refused when made, like a quantized one."""
    with pytest.raises(VkdflashError, match=f"head_dim .*{head_dim}"):
        KVCache(ctx0, 1, 4, 2, head_dim, ctype, ctype, name="odd")


@pytest.mark.parametrize("head_dim", [32, 96, 128, 256])
@pytest.mark.parametrize("ctk, ctv", [("q8_0", "q8_0"), ("q4_0", "q8_0")])
def test_attention_at_each_head_dim(ctx0, head_dim, ctk, ctv):
    written_twice_then_read(Pair(ctx0, ctk, ctv, head_dim=head_dim, n_head_kv=1, n_head=2, n_ctx=9), head_dim, 6)


def written_twice_then_read(p, seed: int, first: int) -> None:
    """`first` rows, then the rest of the context; the bytes, then attention of a block of queries
    after the first write and of one query at the end, against the reference."""
    r, rest = np.random.default_rng(seed), p.cache.n_ctx - first
    try:
        p.write(0, rows(r, first, p.width), rows(r, first, p.width))
        p.write(first, rows(r, rest, p.width), rows(r, rest, p.width))
        p.check_bytes()
        p.check_attention(queries(r, rest, p), first)
        p.check_attention(queries(r, 1, p), p.cache.n_ctx - 1)
    finally:
        p.close()


# -- (4) K and V of different types, GQA ratios -------------------------------------------------

@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_head_kv, n_head", [(2, 2), (1, 3), (1, 8), (2, 6)], ids=["gqa1", "gqa3", "gqa8", "gqa3x2"])
@pytest.mark.parametrize("ctk, ctv", [("q8_0", "q4_0"), ("q4_0", "q8_0")])
def test_k_and_v_of_different_types_at_each_gqa_ratio(ctx0, ctk, ctv, n_head_kv, n_head, head_dim):
    written_twice_then_read(Pair(ctx0, ctk, ctv, head_dim=head_dim, n_head_kv=n_head_kv, n_head=n_head, n_ctx=12),
                            n_head, 8)


# -- (5) a kv_cache_write wrapper observes; it cannot change what is stored ---------------------

class RotatesInItsOwnGraph:
    """Rotates the rows it is handed in a graph of its own, run at once: the core then stored
    H(H x) = x, unrotated rows in a rotated cache (attention NMSE 0.41)."""

    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        g = Graph(graph.ctx)
        try:
            fwht(g, k_rows, k_rows, n_rows, cache.n_head_kv * cache.head_dim, cache.k_rotation)
            g.run()
        finally:
            g.destroy()
        return (yield)


class WritesTheRows:
    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        k_rows.write(np.zeros(n_rows * cache.n_head_kv * cache.head_dim, np.float32))
        return (yield)


class MovesThePositions:
    @hookimpl(wrapper=True)
    def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
        positions.write(np.arange(n_rows, dtype=np.uint32)[::-1].copy())
        return (yield)


@pytest.fixture
def q8(ctx0):
    p = Pair(ctx0, "q8_0", "q8_0", name="observed")
    yield p
    p.close()


def _write_observed(ctx, p, n=6, seed=0):
    r = np.random.default_rng(seed)
    k, v = rows(r, n, p.width), rows(r, n, p.width)
    kb, vb = ctx.upload(k), ctx.upload(v)
    try:
        p.handle.write(ctx, 0, kb, vb, np.arange(n))
        assert np.array_equal(kb.read(np.float32).reshape(k.shape), k), "the caller's K rows changed"
    finally:
        kb.destroy()
        vb.destroy()
    p.ref.write(0, 0, k.reshape(n, p.n_head_kv, p.hd), v.reshape(n, p.n_head_kv, p.hd))
    p.check_bytes()
    p.check_attention(queries(r, 2, p), n - 2)


@pytest.mark.parametrize("plugin", [RotatesInItsOwnGraph(), WritesTheRows(), MovesThePositions()],
                         ids=["rotates in its own graph", "host-writes the rows", "host-writes the positions"])
def test_a_wrapper_cannot_change_what_it_observes(ctx0, q8, fresh_plugins, caplog, plugin):
    plugins.manager().register(plugin, name="changer")
    _write_observed(ctx0, q8)
    assert plugins.manager().get_plugin("changer") is None
    msgs = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "plugin changer" in r.getMessage()]
    assert len(msgs) == 1 and "a kv_cache_write wrapper observes" in msgs[0] and "\n" not in msgs[0], msgs


def test_a_wrapper_that_writes_a_second_cache_leaves_the_rows_to_the_core(ctx0, q8, fresh_plugins):
    """A wrapper may store the rows it observes into a cache of its own (the core's write path).
    That nested write ended the graph's seal (runtime/graph.py's sealed() is not re-entrant), so
    a wrapper called after it could record a rotation of the rows into the graph; the rows are
    read only while wrappers run, so that dispatch is refused all the same."""
    mirror = Pair(ctx0, "q4_0", "q4_0", name="mirror")

    class Mirrors:
        @hookimpl(wrapper=True)
        def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
            if cache.name != "mirror":
                mirror.handle.record_write(graph, layer, k_rows, v_rows, positions, n_rows)
            return (yield)

    class RotatesRowsFirst:
        @hookimpl(wrapper=True)
        def kv_cache_write(self, cache, graph, layer, k_rows, v_rows, positions, n_rows):
            if cache.name != "mirror":
                fwht(graph, k_rows, k_rows, n_rows, cache.n_head_kv * cache.head_dim, cache.k_rotation)
            return (yield)

    try:
        plugins.manager().register(RotatesRowsFirst(), name="rotates")
        plugins.manager().register(Mirrors(), name="mirrors")  # pluggy calls the later one first
        _write_observed(ctx0, q8)
        assert plugins.manager().get_plugin("rotates") is None
        assert plugins.manager().get_plugin("mirrors") is not None
        r = np.random.default_rng(0)
        k, v = rows(r, 6, q8.width), rows(r, 6, q8.width)
        mirror.ref.write(0, 0, k.reshape(6, 2, 64), v.reshape(6, 2, 64))
        mirror.check_bytes()
    finally:
        mirror.close()
