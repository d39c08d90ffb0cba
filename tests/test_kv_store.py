"""KV-cache store: byte-identity with gguf-py (ggml's iq4_nl reference for iq4_nl), positions
checking, untouched rows, replay with rewritten positions, batch invariance, pieced caches."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import quants as gq

from vkdflash.errors import VkdflashError
from vkdflash.kernels.kv_store import cache_row_bytes, store_rows, write_positions
from vkdflash.kernels.types import CACHE_TYPES, get_type
from vkdflash.ref.quantize import dequantize, quant_step, quantize, quantize_iq4_nl
from vkdflash.runtime.graph import Graph

GGUF_TYPES = [t for t in CACHE_TYPES if t != "iq4_nl"]


def edge_rows(row_len: int, seed: int) -> np.ndarray:
    """Uniform rows plus the blocks quantizers get wrong: zeros (and -0.0 first), one outlier,
    a negative maximum, values tiny enough for f16-subnormal scales, ties for round-half-away,
    magnitudes past f16 range."""
    r = np.random.default_rng(seed)
    x = r.uniform(-1, 1, (12, row_len)).astype(np.float32)
    x[0] = 0.0
    x[1] = 0.0
    x[1, ::32] = -0.0
    x[2, 5] = 37.0                                   # a single outlier
    x[3] = -np.abs(x[3])                             # all negative: the max is negative
    x[3, 9] = -1.5
    x[4] *= 1e-3                                     # d below f16's normal range
    x[5] *= 1e-6
    x[6, :32] = np.r_[127.0, [2.5, -3.5, 0.5, -0.5, 1.5, -126.5] * 5, 0.0]  # q8_0 ties
    x[7] *= 7e4                                      # f16 overflow
    x[8, :32] = np.linspace(-8, 7, 32)               # q4_0 levels exactly
    x[9] = np.round(x[9] * 16) / 16                  # many exact grid values
    x[10] = 1.0                                      # flat block: max == min
    x[11] = r.standard_normal(row_len).astype(np.float32) ** 3
    return x


def store(ctx, x: np.ndarray, pos, n_ctx: int, cache_type: str, init: np.ndarray | None = None) -> np.ndarray:
    n_rows, row_len = x.shape
    rb = cache_row_bytes(row_len, cache_type)
    cache = ctx.buffer(n_ctx * rb)
    cache.write(np.zeros(n_ctx * rb, np.uint8) if init is None else init)
    src, posb = ctx.upload(np.ascontiguousarray(x, np.float32)), ctx.buffer(4 * n_rows)
    write_positions(posb, pos, n_ctx)
    g = Graph(ctx)
    store_rows(g, src, posb, cache, n_rows, row_len, cache_type)
    g.run()
    out = cache.read(np.uint8).reshape(n_ctx, rb)
    g.destroy(), cache.destroy(), src.destroy(), posb.destroy()
    return out


@pytest.mark.parametrize("cache_type", GGUF_TYPES)
@pytest.mark.parametrize("loads", ["fast", "storage"])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_bytes_match_gguf(ctx, cache_type, loads, monkeypatch):
    """Both access paths (texel loads and 16-byte stores where they apply; storage-buffer loads
    and 2-byte stores) store gguf's bytes."""
    if loads == "storage":
        import vkdflash.kernels.kv_store as kv_store
        monkeypatch.setattr(kv_store, "texel_views", lambda ctx, views, fmt="f32x4": None)
        monkeypatch.setattr(kv_store, "wide_stores", lambda t, offsets: False)
    x = edge_rows(128, 1)
    pos = np.arange(len(x))[::-1]
    got = store(ctx, x, pos, len(x), cache_type)[pos]
    t = get_type(cache_type)
    want = np.ascontiguousarray(gq.quantize(x, t.gguf)).view(np.uint8).reshape(got.shape)
    bad = np.nonzero((got != want).any(axis=1))[0]
    assert bad.size == 0, f"{cache_type}: rows {bad.tolist()} differ from gguf.quants"


def test_iq4_nl_matches_reference(ctx):
    x = np.concatenate([edge_rows(256, 2), np.full((1, 256), 1e-16, np.float32)])
    got = store(ctx, x, np.arange(len(x)), len(x), "iq4_nl")
    want = quantize_iq4_nl(x)
    bad = np.nonzero((got != want).any(axis=1))[0]
    assert bad.size == 0, f"iq4_nl rows {bad.tolist()} differ from the ggml reference port"
    # and decode to the input within one codebook step (where the f16 scale did not underflow)
    ok = np.abs(x).max(axis=1) > 1e-4
    step = quant_step(want, "iq4_nl")[ok]
    assert np.all(np.abs(dequantize(got, "iq4_nl")[ok] - x[ok]) <= step)


def test_iq4_nl_reference():
    x = np.random.default_rng(3).standard_normal((512, 32)).astype(np.float32)
    raw = quantize_iq4_nl(x)
    assert raw.shape == (512, 18)
    err = {n: float(np.mean((dequantize(quantize_iq4_nl(x, n), "iq4_nl") - x) ** 2)) for n in (-1, 7)}
    assert err[-1] < 0.01 * np.mean(x * x) * 1.5
    assert err[7] <= err[-1]  # the scale search only ever improves the fit
    assert not quantize_iq4_nl(np.zeros((2, 32), np.float32)).any()
    # nearest codebook entry for the block's own scale, never further than one step
    d = raw[:, :2].copy().view(np.float16).astype(np.float32)
    assert np.all(np.abs(dequantize(raw, "iq4_nl") - x) <= quant_step(raw, "iq4_nl") + 1e-6 * np.abs(d))


@pytest.mark.parametrize("cache_type", ["f16", "q8_0", "q4_1", "iq4_nl"])
def test_only_named_rows_change_and_replay(ctx, cache_type):
    n_ctx, row_len, n_rows = 30, 192, 4
    rb = cache_row_bytes(row_len, cache_type)
    r = np.random.default_rng(4)
    init = r.integers(0, 256, n_ctx * rb, dtype=np.uint8)
    cache = ctx.buffer(n_ctx * rb)
    cache.write(init)
    src, posb = ctx.buffer(4 * n_rows * row_len), ctx.buffer(4 * n_rows)
    g = Graph(ctx)
    store_rows(g, src, posb, cache, n_rows, row_len, cache_type)  # recorded once
    want = init.reshape(n_ctx, rb).copy()
    for pos in ([29, 3, 17, 4], [0, 1, 28, 5]):  # replayed with new rows and positions
        x = r.uniform(-1, 1, (n_rows, row_len)).astype(np.float32)
        src.write(x)
        write_positions(posb, pos, n_ctx)
        g.run()
        want[pos] = quantize(x, cache_type)
        got = cache.read(np.uint8).reshape(n_ctx, rb)
        assert np.array_equal(got, want), f"rows {np.nonzero((got != want).any(1))[0].tolist()} wrong"
    g.destroy(), cache.destroy(), src.destroy(), posb.destroy()


def test_bad_input_raises(ctx0):
    buf = ctx0.buffer(64)
    for pos in ([0, 8], [-1], [2, 2]):
        with pytest.raises(VkdflashError):
            write_positions(buf, pos, 8)
    with pytest.raises(VkdflashError):
        write_positions(buf, list(range(17)), 100)  # does not fit the buffer
    g = Graph(ctx0)
    big = ctx0.buffer(1 << 16)
    for kw in ({"cache_type": "q4_k"}, {"cache_type": "q8_1"}, {"row_len": 48}, {"n_rows": 0}, {"n_rows": 200}):
        args = {"n_rows": 2, "row_len": 64, "cache_type": "q8_0", **kw}
        with pytest.raises(VkdflashError):
            store_rows(g, big, buf, big.view(0, 34 * 2 * 10), **args)
    with pytest.raises(VkdflashError):  # cache size not a whole number of rows
        store_rows(g, big, buf, big.view(0, 100), 2, 64, "q8_0")
    assert len(g) == 0
    g.destroy(), buf.destroy(), big.destroy()


@pytest.mark.parametrize("cache_type", CACHE_TYPES)
def test_batch_invariance(ctx, cache_type):
    """Row i's bytes are identical whether 1 or 64 rows are stored together."""
    x = np.random.default_rng(5).uniform(-1, 1, (64, 128)).astype(np.float32)
    rb = cache_row_bytes(128, cache_type)
    cache, src, posb = ctx.buffer(64 * rb), ctx.upload(x), ctx.buffer(256)
    write_positions(posb, np.arange(64), 64)
    full = None
    for n in range(64, 0, -1):
        cache.write(np.zeros(64 * rb, np.uint8))
        g = Graph(ctx)
        store_rows(g, src, posb, cache, n, 128, cache_type)
        g.run()
        g.destroy()
        got = cache.read(np.uint8).reshape(64, rb)
        full = got if full is None else full
        assert np.array_equal(got[:n], full[:n]), f"{cache_type}: batch of {n} differs"
    cache.destroy(), src.destroy(), posb.destroy()


def test_cache_split_into_pieces(ctx, monkeypatch):
    """A cache larger than one binding is stored piece by piece (range shrunk to force it)."""
    monkeypatch.setattr(ctx.features, "max_storage_buffer_range", 1024)
    x = np.random.default_rng(6).uniform(-1, 1, (6, 64)).astype(np.float32)
    pos = [0, 14, 15, 16, 31, 47]  # first, piece edges, last
    got = store(ctx, x, pos, 48, "q8_0")  # 48 rows x 68 bytes = 3264 bytes
    want = np.zeros_like(got)
    want[pos] = quantize(x, "q8_0")
    assert np.array_equal(got, want)
