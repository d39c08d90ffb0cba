"""KV-cache store: the whole cache after a store must equal the numpy quantizer's bytes in the
named rows and stay untouched elsewhere (docs/design.md section 7: bit-exact with gguf-py;
iq4_nl within one quant step of ggml's reference algorithm). Rotating stores must equal the
quantizer's bytes of the rotated rows (ref.hadamard.fwht_f32, bit-identical to the kernel's
transform); `launch` checks that the source rows are unchanged. "pair" cases store K and V rows
in one dispatch (set_rows_kv) into two caches of one buffer, with untouched bytes between."""
from __future__ import annotations

import numpy as np

from . import Case, launch, rng, uniform
from ..kernels.kv_store import cache_row_bytes, store_rows, write_positions
from ..kernels.types import CACHE_TYPES, get_type
from ..runtime.memory import View
from ..ref.hadamard import fwht_f32
from ..ref.quantize import dequantize, quant_step, quantize

# (row_len, n_rows, n_ctx): decode, a prompt batch, a 64-row batch, a ragged row length
SHAPES = [(64, 1, 8), (256, 5, 40), (1024, 64, 100), (96, 7, 9)]


# (rotation, row_len, n_rows, n_ctx): head_dim 64, 128 (two heads) and 256
ROTATED_SHAPES = [(64, 128, 3, 8), (128, 256, 5, 12), (256, 256, 2, 4)]


def _case(cache_type: str, row_len: int, n_rows: int, n_ctx: int, rotation: int = 0):
    exact = cache_type != "iq4_nl"  # the only type gguf-py cannot quantize

    def run(ctx):
        r = rng("kv_store", cache_type, row_len, n_rows, n_ctx, rotation)
        x = uniform(r, n_rows, row_len)
        pos = r.permutation(n_ctx)[:n_rows]  # distinct, unordered, non-contiguous
        rb = cache_row_bytes(row_len, cache_type)
        posb = ctx.buffer(4 * n_rows)
        write_positions(posb, pos, n_ctx)
        got = launch(ctx, n_ctx * rb, lambda g, src, p, out: store_rows(g, src, p, out, n_rows, row_len, cache_type,
                                                                        rotation=rotation),
                     x, posb, dtype=np.uint8).reshape(n_ctx, rb)
        want = got.copy()
        want[:] = 0xA5  # Output's fill: rows not stored keep it
        want[pos] = quantize(fwht_f32(x, rotation) if rotation else x, cache_type)
        if exact:
            return got, want
        return dequantize(got, cache_type), dequantize(want, cache_type), quant_step(want, cache_type)

    rot = f"rot={rotation}/" if rotation else ""
    return Case(f"kv_store/{cache_type}/{rot}row_len={row_len},rows={n_rows},n_ctx={n_ctx}", run,
                metric="exact" if exact else "quant")


def _pair_case(cache_type: str, row_len: int, n_rows: int, n_ctx: int, rotation: int = 0):
    exact = cache_type != "iq4_nl"

    def run(ctx):
        r = rng("kv_store", "pair", cache_type, row_len, n_rows, n_ctx, rotation)
        xk, xv = uniform(r, n_rows, row_len), uniform(r, n_rows, row_len)
        pos = r.permutation(n_ctx)[:n_rows]
        rb = cache_row_bytes(row_len, cache_type)
        size, gap = n_ctx * rb, -(-n_ctx * rb // 256) * 256  # the V cache at a bindable offset
        posb = ctx.buffer(4 * n_rows)
        write_positions(posb, pos, n_ctx)

        def record(g, k, v, p, out):
            store_rows(g, k, p, View(out.buffer, out.offset, size), n_rows, row_len, cache_type, rotation=rotation,
                       second=(v, View(out.buffer, out.offset + gap, size)))

        got = launch(ctx, gap + size, record, xk, xv, posb, dtype=np.uint8)
        want = np.full_like(got, 0xA5)
        for at, x in ((0, xk), (gap, xv)):
            want[at:at + size].reshape(n_ctx, rb)[pos] = quantize(fwht_f32(x, rotation) if rotation else x, cache_type)
        if exact:
            return got, want
        halves = [np.concatenate([a[:size], a[gap:gap + size]]).reshape(2 * n_ctx, rb) for a in (got, want)]
        assert np.array_equal(got[size:gap], want[size:gap]), "bytes between the caches changed"
        return (dequantize(halves[0], cache_type), dequantize(halves[1], cache_type),
                quant_step(halves[1], cache_type))

    rot = f"rot={rotation}/" if rotation else ""
    return Case(f"kv_store/pair/{cache_type}/{rot}row_len={row_len},rows={n_rows},n_ctx={n_ctx}", run,
                metric="exact" if exact else "quant")


def cases():
    return ([_case(t, *s) for t in CACHE_TYPES for s in SHAPES]
            + [_case(t, row_len, n_rows, n_ctx, rot) for t in CACHE_TYPES if get_type(t).quantized
               for rot, row_len, n_rows, n_ctx in ROTATED_SHAPES]
            + [_pair_case(t, *s) for t in CACHE_TYPES for s in SHAPES[:2]]
            + [_pair_case(t, *ROTATED_SHAPES[0][1:], ROTATED_SHAPES[0][0]) for t in CACHE_TYPES if get_type(t).quantized])
